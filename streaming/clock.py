"""Time for the media path: one place reads the clock, so tests can advance a fake one by hand.

Pacing is always against absolute deadlines (``start + index / fps``), never by sleeping a fixed period, so
scheduling jitter never accumulates.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    async def sleep_until(self, deadline_s: float) -> None:
        """Return once ``now() >= deadline_s`` (immediately if it already is)."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline_s: float) -> None:
        delay_s = deadline_s - time.monotonic()
        if delay_s > 0:
            await asyncio.sleep(delay_s)


@dataclass(frozen=True)
class FrameTimeline:
    """The session's media clock: frame ``k`` is due at ``start_s + k / fps``."""

    start_s: float
    fps: int

    @property
    def frame_s(self) -> float:
        return 1.0 / self.fps

    def due(self, index: int) -> float:
        return self.start_s + index / self.fps

    def index_at(self, t_s: float) -> int:
        """The last frame index due at or before ``t_s`` (-1 before the start)."""
        return math.floor(round((t_s - self.start_s) * self.fps, 9))
