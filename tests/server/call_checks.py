"""What every call through the server with a neural backend on the CPU must show, whatever the render speed:
video at the media clock's rate with all of its audio, and every frame sent to the engine accounted for."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np


async def check_paced_call(recording: Any, result: Any, runtime: Any, min_active: int = 50) -> None:
    """Paced by the clock, not by the renders; every submitted frame rendered, expired or cancelled."""
    frames = [m for _, m in recording.meta]
    active = [m for m in frames if m["active"]]
    assert 20.0 <= result.fps <= 26.0, result.fps
    assert np.all(np.diff(recording.video.pts) > 0), "frames out of order"
    assert result.audio_returned >= 0.99 and result.freezes == 0, result
    assert len(active) >= min_active  # both bursts went to the engine
    stats = runtime.engine.stats
    submitted = runtime.sessions.totals()["frames_rendered"]
    assert submitted >= len(active)
    # the batch in flight when the call ends still finishes: wait for it
    for _ in range(200):
        if stats.frames + stats.expired + stats.cancelled == submitted:
            break
        await asyncio.sleep(0.05)
    assert stats.frames + stats.expired + stats.cancelled == submitted, (stats, submitted)
    assert stats.failed_batches == 0 and stats.frames > 0, stats
    # a render that missed its presentation time repeats the previous frame: sent on time, flagged late
    assert sum(1 for m in active if not m["late"]) > 0, "no rendered frame arrived in time"
