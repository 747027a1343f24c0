from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lipcast.pipeline.wav2lip import mel as wmel

DATA = Path(__file__).parent / "data" / "wav2lip_librosa_mel.npz"
# wav2lip_librosa_mel.npz was made once with librosa 0.11.0 and scipy (neither is a dependency):
#   basis = librosa.filters.mel(sr=16000, n_fft=800, n_mels=80, fmin=55, fmax=7600)
#   y = scipy.signal.lfilter([1, -0.97], [1], wav)
#   D = librosa.stft(y=y, n_fft=800, hop_length=200, win_length=800, center=True, pad_mode="reflect")
#   S = 20 * log10(max(1e-5, basis @ |D|)) - 20;  mel = clip(8 * (S + 100) / 100 - 4, -4, 4)
# for a 0.5 s clip of two sines and noise stored beside it.


def slaney_mel(freq_hz: float) -> float:
    if freq_hz < 1000.0:
        return 3.0 * freq_hz / 200.0
    return 15.0 + 27.0 * math.log(freq_hz / 1000.0) / math.log(6.4)


def slaney_hz(mel: float) -> float:
    if mel < 15.0:
        return 200.0 * mel / 3.0
    return 1000.0 * 6.4 ** ((mel - 15.0) / 27.0)


def reference_filterbank() -> np.ndarray:
    """Triangles by their definition, one weight at a time."""
    lo_mel, hi_mel = slaney_mel(55.0), slaney_mel(7600.0)
    edges = [slaney_hz(lo_mel + (hi_mel - lo_mel) * j / 81) for j in range(82)]
    out = np.zeros((80, 401))
    for m in range(80):
        left, center, right = edges[m], edges[m + 1], edges[m + 2]
        for k in range(401):
            f = k * 16000 / 800
            if left < f <= center:
                w = (f - left) / (center - left)
            elif center < f < right:
                w = (right - f) / (right - center)
            else:
                w = 0.0
            out[m, k] = w * 2.0 / (right - left)
    return out


def reference_mel(wav: np.ndarray) -> np.ndarray:
    """Direct DFT, explicit mirror indices, pre-emphasis by convolution."""
    y = np.convolve(wav.astype(np.float64), [1.0, -0.97])[: wav.size]
    n = np.arange(-400, y.size + 400)
    mirrored = np.abs(n)
    mirrored = np.where(mirrored >= y.size, 2 * (y.size - 1) - mirrored, mirrored)
    padded = y[mirrored]
    frames = np.stack([padded[t * 200 : t * 200 + 800] for t in range(1 + y.size // 200)])
    window = np.sin(np.pi * np.arange(800) / 800) ** 2  # periodic Hann
    k = np.arange(401)[:, None] * np.arange(800)[None, :]
    dft = np.exp(-2j * np.pi * k / 800)
    magnitude = np.abs(dft @ (frames * window).T)  # (401, T)
    level = 20 * np.log10(np.maximum(1e-5, reference_filterbank() @ magnitude)) - 20
    return np.clip(8 * (level + 100) / 100 - 4, -4, 4)


def test_filterbank_matches_its_definition() -> None:
    basis = wmel.mel_filterbank()
    assert basis.shape == (80, 401) and basis.dtype == np.float32
    np.testing.assert_allclose(basis, reference_filterbank(), rtol=0, atol=1e-7)
    assert basis[:, 0].max() == 0 and basis[:, 380:].max() == 0  # 55 Hz .. 7.6 kHz only


def test_filterbank_and_mel_match_librosa_fixture() -> None:
    data = np.load(DATA)
    np.testing.assert_allclose(wmel.MEL_BASIS, data["basis"], rtol=0, atol=1e-7)
    np.testing.assert_allclose(wmel.melspectrogram(data["wav"]), data["mel"], rtol=0, atol=1e-4)


def test_offline_mel_matches_reference() -> None:
    rng = np.random.default_rng(3)
    wav = (0.2 * rng.standard_normal(3210)).astype(np.float32)
    wav[1000:1400] = 0.0
    out = wmel.melspectrogram(wav)
    assert out.shape == (80, 1 + 3210 // 200) and out.dtype == np.float32
    np.testing.assert_allclose(out, reference_mel(wav), rtol=0, atol=1e-4)


def test_reflect_padding_not_zero_padding_at_the_edges() -> None:
    rng = np.random.default_rng(4)
    wav = (0.3 * rng.standard_normal(4000)).astype(np.float32)
    y = np.convolve(wav.astype(np.float64), [1.0, -0.97])[: wav.size]
    zero_padded = np.pad(y, 400)[:800] * wmel.HANN_WINDOW
    zero_col = wmel.frames_to_mel(zero_padded[None])[:, 0]
    first = wmel.melspectrogram(wav)[:, 0]
    assert np.abs(first - zero_col).max() > 0.05
    np.testing.assert_allclose(first, reference_mel(wav)[:, 0], atol=1e-4)


def test_silence_is_the_floor_and_full_scale_stays_below_the_top() -> None:
    assert np.all(wmel.melspectrogram(np.zeros(1600, np.float32)) == -4.0)
    rng = np.random.default_rng(5)
    loud = wmel.melspectrogram(rng.uniform(-1, 1, 16000).astype(np.float32))
    assert loud.max() < 4.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_equals_offline_for_random_chunks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(16000 * 2) / 16000
    wav = (0.3 * np.sin(2 * np.pi * 180 * t) + 0.1 * rng.standard_normal(t.size)).astype(np.float32)
    stream = wmel.StreamingMel()
    columns = []
    pushed = 0
    while pushed < wav.size:
        size = int(rng.integers(0, 900))
        new = stream.push(wav[pushed : pushed + size])
        pushed = min(wav.size, pushed + size)
        columns.append(new)
        # every column is out as soon as its window exists, and no sooner
        emitted = sum(c.shape[1] for c in columns)
        assert emitted == (0 if pushed <= 400 else (pushed - 400) // 200 + 1)
        assert stream.samples_needed_for_next_column > pushed
    streamed = np.concatenate(columns, axis=1)
    offline = wmel.melspectrogram(wav)
    assert streamed.shape[1] == offline.shape[1] - 2  # the two end columns need the end reflection
    np.testing.assert_allclose(streamed, offline[:, : streamed.shape[1]], rtol=0, atol=1e-4)


def test_int16_scale_input_saturates() -> None:
    """Pitfall: samples must be floats in [-1, 1]; int16-scale values drive most bins to the +4 clip."""
    rng = np.random.default_rng(6)
    noise = rng.uniform(-1, 1, 8000).astype(np.float32)
    assert (wmel.melspectrogram(noise * 32767) == 4.0).mean() > 0.5
    assert (wmel.melspectrogram(noise) == 4.0).mean() == 0.0
