from __future__ import annotations

import numpy as np
import pytest

from pipeline.backend import Featurizer
from pipeline.wav2lip.featurizer import (
    INFERENCE_ALIGNMENT,
    TRAINING_ALIGNMENT,
    Wav2LipFeaturizer,
    exact_need_samples,
    window_end_sample,
    window_start_column,
)
from pipeline.wav2lip.mel import melspectrogram


def clip(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * 150 * t * (1 + t)) + 0.05 * rng.standard_normal(t.size)).astype(
        np.float32
    )


@pytest.mark.parametrize(
    ("offset", "need", "lookahead", "ms"),
    [(INFERENCE_ALIGNMENT, 2760, 3200, 200.0), (TRAINING_ALIGNMENT, 2120, 2560, 160.0)],
)
def test_lookahead_per_alignment(offset: int, need: int, lookahead: int, ms: float) -> None:
    featurizer = Wav2LipFeaturizer(25, offset)
    assert isinstance(featurizer, Featurizer)
    assert exact_need_samples(25, offset) == need
    assert featurizer.lookahead_samples == lookahead
    assert featurizer.lookahead_ms == ms
    # whole hops, and the fewest that cover the need of every frame
    assert lookahead % 640 == 0 and lookahead - 640 < need <= lookahead
    needs = [window_end_sample(window_start_column(i, 25, offset)) - 640 * (i + 1) for i in range(1, 40)]
    assert max(needs) == need


def test_inference_alignment_is_the_published_rule() -> None:
    assert [window_start_column(i, 25, 0) for i in range(7)] == [int(i * 80 / 25) for i in range(7)]
    assert [window_start_column(i, 25, -1) for i in range(1, 7)] == [
        int((i - 1) * 80 / 25) for i in range(1, 7)
    ]


@pytest.mark.parametrize("offset", [INFERENCE_ALIGNMENT, TRAINING_ALIGNMENT])
def test_windows_equal_offline_mel_chunks(offset: int) -> None:
    wav = clip(3.0)
    offline = melspectrogram(wav)
    featurizer = Wav2LipFeaturizer(25, offset)
    lag = featurizer.lookahead_samples // 640
    for n in range(1, wav.size // 640 + 1):
        window = featurizer.push(wav[(n - 1) * 640 : n * 640])
        assert window.shape == (80, 16) and window.dtype == np.float32
        frame = n - 1 - lag
        if frame < 0:
            assert np.all(window == -4.0)
            continue
        start = window_start_column(frame, 25, offset)
        assert window_end_sample(start) <= n * 640  # only audio already pushed
        expected = np.full((80, 16), -4.0, dtype=np.float32)
        lo = max(start, 0)
        expected[:, lo - start :] = offline[:, lo : start + 16]
        np.testing.assert_allclose(window, expected, rtol=0, atol=1e-4)
        assert not featurizer.is_at_rest(window, True) and featurizer.is_at_rest(window, False)


def test_training_alignment_frame_zero_starts_in_silence() -> None:
    featurizer = Wav2LipFeaturizer(25, TRAINING_ALIGNMENT)
    wav = clip(1.0, seed=1)
    windows = [featurizer.push(wav[i * 640 : (i + 1) * 640]) for i in range(5)]
    first = windows[4]  # frame 0 after 4 + 1 pushes
    assert np.all(first[:, :4] == -4.0)
    np.testing.assert_allclose(first[:, 4:], melspectrogram(wav)[:, :12], atol=1e-4)


def test_rejects_wrong_hops_and_settings() -> None:
    with pytest.raises(ValueError):
        Wav2LipFeaturizer(25, 1)
    with pytest.raises(ValueError):
        Wav2LipFeaturizer(24)
    with pytest.raises(ValueError):
        Wav2LipFeaturizer().push(np.zeros(320, dtype=np.float32))
