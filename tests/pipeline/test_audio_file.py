"""Decoding audio files: one decoder for ``lipcast render`` (float at 16 and 48 kHz) and the probe (int16)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from lipcast.pipeline.audio_file import decode_audio
from lipcast.probe.patterns import load_audio


def write_wav(path: Path, samples: npt.NDArray[np.int16], rate_hz: int, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate_hz)
        out.writeframes(samples.astype("<i2").tobytes())
    return path


def tone(rate_hz: int, seconds: float, freq_hz: float = 440.0) -> npt.NDArray[np.int16]:
    t = np.arange(int(rate_hz * seconds)) / rate_hz
    return np.round(10_000 * np.sin(2 * np.pi * freq_hz * t)).astype(np.int16)


def test_int16_at_the_files_own_rate_is_the_file(tmp_path: Path) -> None:
    samples = tone(48_000, 0.5)
    decoded = decode_audio(write_wav(tmp_path / "a.wav", samples, 48_000), 48_000, "s16")
    assert decoded.dtype == np.int16
    np.testing.assert_array_equal(decoded, samples)
    np.testing.assert_array_equal(load_audio(tmp_path / "a.wav"), samples)  # the probe's --wav


def test_float_is_resampled_in_unit_range(tmp_path: Path) -> None:
    decoded = decode_audio(write_wav(tmp_path / "t.wav", tone(44_100, 1.0), 44_100), 16_000)
    assert decoded.dtype == np.float32
    assert abs(len(decoded) - 16_000) <= 32  # one second, give or take the resampler's edges
    peak = float(np.abs(decoded).max())
    assert 10_000 / 32768 * 0.95 < peak < 10_000 / 32768 * 1.05
    spectrum = np.abs(np.fft.rfft(decoded[:16_000]))
    assert np.argmax(spectrum) == pytest.approx(440, abs=2)  # 1 Hz bins: still a 440 Hz tone


def test_stereo_comes_out_mono(tmp_path: Path) -> None:
    stereo = np.repeat(tone(48_000, 0.5), 2)  # interleaved: both channels the same tone
    decoded = decode_audio(write_wav(tmp_path / "s.wav", stereo, 48_000, channels=2), 48_000)
    assert decoded.shape == (24_000,)
    assert float(np.abs(decoded).max()) > 0.2


def test_a_file_without_samples_is_a_clear_error(tmp_path: Path) -> None:
    empty = write_wav(tmp_path / "empty.wav", np.zeros(0, np.int16), 48_000)
    with pytest.raises(ValueError, match="holds no audio"):
        decode_audio(empty, 16_000)
