"""Warm-up: render a batch of every fixed size (cuDNN autotuning, CUDA graph capture, compilation), then time
the steady renders. One routine for the engine (:meth:`lipcast.pipeline.engine.RenderEngine.warmup`) and for a
backend warmed up on its own (:meth:`lipcast.pipeline.wav2lip.backend.Wav2LipBackend.warmup`).

And a featurizer's first speech (:func:`warm_featurizer`): a process that takes calls runs it once before it
says ready, so that a call's first frames do not pay for what a featurizer does once per process (a media
worker unpickling the Wav2Lip featurizer imported its modules during the first offer, a 56 ms event-loop
stall on the H200; the first mel frames of real audio take code paths silence does not).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from lipcast.pipeline.backend import Featurizer, FloatArray, RenderedPatch, RenderItem
from lipcast.pipeline.timing import FEATURE_SAMPLE_RATE_HZ, FEATURE_SAMPLES_PER_FRAME

WARMUP_TIMED_RENDERS = 5  # after the first render of a size (which captures, tunes, compiles)


def time_batch_sizes(
    render: Callable[[Sequence[RenderItem]], list[RenderedPatch]],
    avatar: str,
    frame_count: int,
    conditioning: FloatArray,
    batch_sizes: Sequence[int],
    repeats: int = WARMUP_TIMED_RENDERS,
    enhance_strength: float = 0.0,
) -> dict[int, float]:
    """Render one batch of every size in ``batch_sizes`` once, then ``repeats`` more times; the batch cycles
    through the avatar's ``frame_count`` frames, every item with ``conditioning`` (and ``enhance_strength``:
    above 0 every row also runs the sharpen stage). Returns ms per size: the median of the repeats (the steady
    render time), or with ``repeats`` 0 the time of the first render."""
    timings: dict[int, float] = {}
    for size in batch_sizes:
        items = [RenderItem(avatar, i % frame_count, conditioning, enhance_strength) for i in range(size)]
        times_ms = []
        for _ in range(1 + repeats):
            start_s = time.perf_counter()
            render(items)
            times_ms.append((time.perf_counter() - start_s) * 1000.0)
        timings[size] = float(np.median(times_ms[1:] or times_ms))
    return timings


def speech_like_audio(seconds: float, sample_rate_hz: int = FEATURE_SAMPLE_RATE_HZ) -> FloatArray:
    """A voiced test signal in [-1, 1]: a 140 Hz harmonic series under a 4 Hz syllable envelope, with
    pauses (what a featurizer sees of a talker: loud and quiet frames, silence between)."""
    t = np.arange(round(seconds * sample_rate_hz)) / sample_rate_hz
    voice = sum(np.sin(2 * np.pi * 140.0 * k * t) / k for k in range(1, 8))
    envelope = np.clip(np.sin(2 * np.pi * 4.0 * t), 0.0, None) ** 2
    return (0.3 * voice * envelope).astype(np.float32)


def warm_featurizer(featurizer: Featurizer, seconds: float = 1.0) -> int:
    """Push ``seconds`` of :func:`speech_like_audio` (then as much silence) through ``featurizer`` one hop
    at a time, asking ``is_at_rest`` of every frame, as a call does. Returns the frames pushed."""
    audio = np.concatenate(
        [speech_like_audio(seconds), np.zeros(round(seconds * FEATURE_SAMPLE_RATE_HZ), np.float32)]
    )
    frames = len(audio) // FEATURE_SAMPLES_PER_FRAME
    for index in range(frames):
        hop = audio[index * FEATURE_SAMPLES_PER_FRAME : (index + 1) * FEATURE_SAMPLES_PER_FRAME]
        featurizer.is_at_rest(featurizer.push(hop), bool(np.abs(hop).max() > 0.01))
    return frames
