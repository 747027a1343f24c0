from __future__ import annotations

import numpy as np
import pytest

from lipcast.pipeline.backend import Featurizer
from lipcast.pipeline.wav2lip.featurizer import (
    INFERENCE_ALIGNMENT,
    TRAINING_ALIGNMENT,
    Wav2LipFeaturizer,
    exact_need_samples,
    window_end_sample,
    window_start_column,
)
from lipcast.pipeline.wav2lip.mel import melspectrogram


def clip(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * 150 * t * (1 + t)) + 0.05 * rng.standard_normal(t.size)).astype(
        np.float32
    )


@pytest.mark.parametrize(
    ("offset", "need", "ms", "lag", "lead"),
    [(INFERENCE_ALIGNMENT, 2760, 172.5, 4, 200), (TRAINING_ALIGNMENT, 2120, 132.5, 3, 200)],
)
def test_lookahead_is_the_exact_need(offset: int, need: int, ms: float, lag: int, lead: int) -> None:
    featurizer = Wav2LipFeaturizer(25, offset)
    assert isinstance(featurizer, Featurizer)
    assert exact_need_samples(25, offset) == need
    # no rounding up to whole hops: the lead of silence puts the rest in front of the call
    assert featurizer.lookahead_samples == need
    assert featurizer.lookahead_ms == ms
    assert (featurizer.lag_frames, featurizer.lead_samples) == (lag, lead)
    needs = [window_end_sample(window_start_column(i, 25, offset)) - 640 * (i + 1) for i in range(1, 40)]
    assert max(needs) == need


def test_inference_alignment_is_the_published_rule() -> None:
    assert [window_start_column(i, 25, 0) for i in range(7)] == [int(i * 80 / 25) for i in range(7)]
    assert [window_start_column(i, 25, -1) for i in range(1, 7)] == [
        int((i - 1) * 80 / 25) for i in range(1, 7)
    ]


@pytest.mark.parametrize("offset", [INFERENCE_ALIGNMENT, TRAINING_ALIGNMENT])
def test_windows_equal_offline_mel_chunks(offset: int) -> None:
    """Frame i's window is the published one of a clip whose frame 0 starts ``lead`` samples early."""
    wav = clip(3.0)
    featurizer = Wav2LipFeaturizer(25, offset)
    lag, lead = featurizer.lag_frames, featurizer.lead_samples
    offline = melspectrogram(np.concatenate((np.zeros(lead, dtype=np.float32), wav)))
    ready_at_push = []
    for n in range(1, wav.size // 640 + 1):
        window = featurizer.push(wav[(n - 1) * 640 : n * 640])
        assert window.shape == (80, 16) and window.dtype == np.float32
        frame = n - 1 - lag
        if frame < 0:
            assert np.all(window == -4.0)
            continue
        start = window_start_column(frame, 25, offset)
        end = window_end_sample(start) - lead  # in pushed samples
        assert end <= n * 640  # only audio already pushed
        ready_at_push.append(end == n * 640)
        # and frame i's own hop ends exactly lookahead_samples before the newest pushed sample
        assert 640 * (frame + 1) - lead == n * 640 - featurizer.lookahead_samples
        expected = np.full((80, 16), -4.0, dtype=np.float32)
        lo = max(start, 0)
        expected[:, lo - start :] = offline[:, lo : start + 16]
        np.testing.assert_allclose(window, expected, rtol=0, atol=1e-4)
        assert not featurizer.is_at_rest(window, True) and featurizer.is_at_rest(window, False)
    assert sum(ready_at_push) >= 10  # the neediest frames (one in 5) use the newest sample: no slack


def test_training_alignment_frame_zero_starts_in_silence() -> None:
    featurizer = Wav2LipFeaturizer(25, TRAINING_ALIGNMENT)
    wav = clip(1.0, seed=1)
    windows = [featurizer.push(wav[i * 640 : (i + 1) * 640]) for i in range(4)]
    first = windows[3]  # frame 0 after 3 + 1 pushes
    assert np.all(first[:, :4] == -4.0)
    lead = np.zeros(featurizer.lead_samples, dtype=np.float32)
    np.testing.assert_allclose(first[:, 4:], melspectrogram(np.concatenate((lead, wav)))[:, :12], atol=1e-4)


def test_rejects_wrong_hops_and_settings() -> None:
    with pytest.raises(ValueError):
        Wav2LipFeaturizer(25, 1)
    with pytest.raises(ValueError):
        Wav2LipFeaturizer(24)
    with pytest.raises(ValueError):
        Wav2LipFeaturizer().push(np.zeros(320, dtype=np.float32))
