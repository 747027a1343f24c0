"""The startup warm-ups: a featurizer's first speech (what a process runs before it takes calls)."""

from __future__ import annotations

import numpy as np
import torch

from lipcast.pipeline.backend import Featurizer, FloatArray
from lipcast.pipeline.builtin import BuiltinBackend
from lipcast.pipeline.timing import FEATURE_SAMPLE_RATE_HZ, FEATURE_SAMPLES_PER_FRAME
from lipcast.pipeline.warmup import speech_like_audio, warm_featurizer
from lipcast.pipeline.wav2lip.featurizer import Wav2LipFeaturizer
from lipcast.pipeline.wav2lip.mel import SILENCE_LEVEL


class Recording:
    """A featurizer (``inner``) whose hops, speech flags and conditioning are kept."""

    def __init__(self, inner: Featurizer) -> None:
        self.inner = inner
        self.lookahead_samples = inner.lookahead_samples
        self.hops: list[FloatArray] = []
        self.speech_flags: list[bool] = []
        self.out: list[FloatArray] = []

    def push(self, hop: FloatArray) -> FloatArray:
        self.hops.append(hop.copy())
        self.out.append(self.inner.push(hop))
        return self.out[-1]

    def is_at_rest(self, conditioning: FloatArray, speech: bool) -> bool:
        self.speech_flags.append(speech)
        return self.inner.is_at_rest(conditioning, speech)


def test_speech_like_audio_has_loud_and_silent_stretches() -> None:
    audio = speech_like_audio(1.0)
    assert audio.shape == (FEATURE_SAMPLE_RATE_HZ,) and audio.dtype == np.float32
    assert 0.3 < np.abs(audio).max() <= 1.0
    hops = audio[: len(audio) // FEATURE_SAMPLES_PER_FRAME * FEATURE_SAMPLES_PER_FRAME].reshape(
        -1, FEATURE_SAMPLES_PER_FRAME
    )
    peaks = np.abs(hops).max(axis=1)
    assert (peaks > 0.1).sum() >= 5 and (peaks < 0.01).sum() >= 3  # syllables and the pauses between


def test_warm_featurizer_feeds_whole_hops_of_speech_then_silence_and_asks_rest_per_frame() -> None:
    featurizer = Recording(Wav2LipFeaturizer())
    frames = warm_featurizer(featurizer, seconds=1.0)
    assert frames == 2 * FEATURE_SAMPLE_RATE_HZ // FEATURE_SAMPLES_PER_FRAME == len(featurizer.hops)
    assert all(hop.shape == (FEATURE_SAMPLES_PER_FRAME,) for hop in featurizer.hops)
    assert len(featurizer.speech_flags) == frames
    assert any(featurizer.speech_flags[:25]) and not any(featurizer.speech_flags[25:])


def test_warm_featurizer_runs_the_real_featurizers_through_speech() -> None:
    wav2lip = Recording(Wav2LipFeaturizer())
    warm_featurizer(wav2lip)
    assert all(window.shape == (80, 16) for window in wav2lip.out)
    assert max(window.max() for window in wav2lip.out) > SILENCE_LEVEL + 1.0  # mel windows of the speech
    builtin = Recording(BuiltinBackend(torch.device("cpu")).new_featurizer())
    warm_featurizer(builtin)
    assert max(conditioning[0] for conditioning in builtin.out) > 0.1  # the mouth opened
