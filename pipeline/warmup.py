"""Warm-up: render a batch of every fixed size (cuDNN autotuning, CUDA graph capture, compilation), then time
the steady renders. One routine for the engine (:meth:`pipeline.engine.RenderEngine.warmup`) and for a backend
warmed up on its own (:meth:`pipeline.wav2lip.backend.Wav2LipBackend.warmup`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from pipeline.backend import FloatArray, RenderedPatch, RenderItem

WARMUP_TIMED_RENDERS = 5  # after the first render of a size (which captures, tunes, compiles)


def time_batch_sizes(
    render: Callable[[Sequence[RenderItem]], list[RenderedPatch]],
    avatar: str,
    frame_count: int,
    conditioning: FloatArray,
    batch_sizes: Sequence[int],
    repeats: int = WARMUP_TIMED_RENDERS,
) -> dict[int, float]:
    """Render one batch of every size in ``batch_sizes`` once, then ``repeats`` more times; the batch cycles
    through the avatar's ``frame_count`` frames, every item with ``conditioning``. Returns ms per size: the
    median of the repeats (the steady render time), or with ``repeats`` 0 the time of the first render."""
    timings: dict[int, float] = {}
    for size in batch_sizes:
        items = [RenderItem(avatar, i % frame_count, conditioning) for i in range(size)]
        times_ms = []
        for _ in range(1 + repeats):
            start_s = time.perf_counter()
            render(items)
            times_ms.append((time.perf_counter() - start_s) * 1000.0)
        timings[size] = float(np.median(times_ms[1:] or times_ms))
    return timings
