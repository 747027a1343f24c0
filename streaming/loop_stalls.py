"""Event-loop stalls: how long the loop went without running a callback, and what it was doing meanwhile.

Every process of the server (the front and each media worker) receives RTP, paces its tracks and answers
HTTP on one asyncio loop. If something blocks that loop (a slow first-time import, a lock, a long callback,
another thread holding the GIL), inbound audio waits in the socket and then arrives all at once, which the
jitter estimator must take for network jitter; outbound packets bunch up the same way. A watchdog thread
measures that directly:

* the loop beats every ``beat_ms`` (a ``call_later`` chain);
* the thread looks every ``beat_ms`` too; once the last beat is older than ``threshold_ms`` it samples the
  loop thread's stack (``sys._current_frames``: the frame that is running, or waiting for the GIL, then)
  and where every other thread is (one of them may be holding the GIL), once per stall;
* when the loop beats again, the stall is logged as a warning with its length and that stack, and counted
  (the histogram ``lipcast_event_loop_stall_seconds``);
* the cyclic garbage collector's pauses are timed too (``gc.callbacks``): a collection stops every thread
  of the process that wants the GIL, and no stack shows it, so the report says how much of the stall was
  spent collecting, and which generation.

The cost is one callback and one thread wake-up per beat (tens of microseconds a second at 10 ms).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_BEAT_MS = 10.0
STACK_FRAMES = 14  # innermost frames kept of a stalled loop's stack


@dataclass(frozen=True)
class Stall:
    duration_ms: float
    stack: str  # the loop thread's innermost frames, sampled while it was stalled ("" if not sampled)
    gc_ms: float = 0.0  # of it, in garbage collection (any thread's)
    gc_generation: int | None = None  # the oldest generation collected in it


class GcPauses:
    """The recent pauses of the cyclic garbage collector, on the monotonic clock (``gc.callbacks``)."""

    def __init__(self, keep: int = 256) -> None:
        self._pauses: deque[tuple[float, float, int]] = deque(maxlen=keep)  # start, end, generation
        self._started_s = 0.0

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collection, on the thread that triggered it, holding the GIL: one clock read.
        if phase == "start":
            self._started_s = time.monotonic()
        else:
            self._pauses.append((self._started_s, time.monotonic(), int(info["generation"])))

    def within(self, start_s: float, end_s: float) -> tuple[float, int | None]:
        """Seconds collected between ``start_s`` and ``end_s``, and the oldest generation among them."""
        total_s, oldest = 0.0, None
        for begin, end, generation in list(self._pauses):
            overlap_s = min(end, end_s) - max(begin, start_s)
            if overlap_s > 0:
                total_s += overlap_s
                oldest = generation if oldest is None else max(oldest, generation)
        return total_s, oldest


def format_stack(frame: object, limit: int = STACK_FRAMES) -> str:
    """A frame's innermost ``limit`` entries as ``file:line function`` lines, innermost last."""
    entries = traceback.extract_stack(frame, limit=limit)  # type: ignore[arg-type]
    return "\n".join(f"  {e.filename}:{e.lineno} {e.name}" for e in entries)


class LoopStallWatch:
    """Logs and reports stalls of ``loop`` longer than ``threshold_ms``; start it from the loop's thread."""

    def __init__(
        self,
        threshold_ms: float,
        *,
        beat_ms: float = DEFAULT_BEAT_MS,
        on_stall: Callable[[Stall], None] | None = None,
    ) -> None:
        if threshold_ms <= beat_ms or beat_ms <= 0:
            raise ValueError("need 0 < beat_ms < threshold_ms")
        self.threshold_s = threshold_ms / 1000.0
        self.beat_s = beat_ms / 1000.0
        self.on_stall = on_stall
        self.stalls: list[Stall] = []  # the last few, newest last (tests and /healthz-style reports)
        self._last_beat_s = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sampled_stack = ""
        self.gc_pauses = GcPauses()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._last_beat_s = time.monotonic()
        self._timer = self._loop.call_later(self.beat_s, self._beat)
        self._thread = threading.Thread(target=self._watch, name="loop-stall-watch", daemon=True)
        self._thread.start()
        self.gc_pauses.install()

    def stop(self) -> None:
        self.gc_pauses.uninstall()
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _beat(self) -> None:
        now = time.monotonic()
        with self._lock:
            last_s, self._last_beat_s = self._last_beat_s, now
            stack, self._sampled_stack = self._sampled_stack, ""
        # The beat was due beat_s after the last one: what is beyond that is the stall.
        stalled_s = now - last_s - self.beat_s
        if stalled_s > self.threshold_s:
            gc_s, generation = self.gc_pauses.within(last_s, now)
            self._report(Stall(round(stalled_s * 1000.0, 1), stack, round(gc_s * 1000.0, 1), generation))
        assert self._loop is not None
        if not self._stop.is_set():
            self._timer = self._loop.call_later(self.beat_s, self._beat)

    def _watch(self) -> None:
        while not self._stop.wait(self.beat_s):
            with self._lock:
                late_s = time.monotonic() - self._last_beat_s - self.beat_s
                if late_s <= self.threshold_s or self._sampled_stack:
                    continue
                self._sampled_stack = self._sample()

    def _sample(self) -> str:
        """The loop thread's stack, then where each other thread is (one of them may hold the GIL)."""
        frames = sys._current_frames()
        loop_frame = frames.get(self._loop_thread_id)
        lines = [format_stack(loop_frame) if loop_frame is not None else "  (no stack)"]
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in frames.items():
            if ident in (self._loop_thread_id, threading.get_ident()):
                continue
            where = format_stack(frame, limit=2).replace("\n", " <-").strip()
            lines.append(f"  other thread {names.get(ident, ident)}: {where}")
        return "\n".join(lines)

    def _report(self, stall: Stall) -> None:
        self.stalls = [*self.stalls[-15:], stall]
        collecting = (
            f" (of it, {stall.gc_ms:.0f} ms in garbage collection, generation {stall.gc_generation})"
            if stall.gc_generation is not None
            else ""
        )
        logger.warning(
            "event loop stalled %.0f ms%s; it was in:\n%s",
            stall.duration_ms,
            collecting,
            stall.stack or "  (not sampled: the stall ended between two looks)",
        )
        if self.on_stall is not None:
            self.on_stall(stall)


def freeze_startup_heap() -> float:
    """Take everything allocated so far out of the cyclic garbage collector's reach (``gc.freeze``).

    A process that imported torch, aiortc and OpenCV and loaded a model holds hundreds of thousands of objects
    that live as long as it does, and every full collection walks them all, on whichever thread allocated
    last, holding the GIL: 75 ms on the 2-core box, and on the H200 host stalls of 100-280 ms in a call's
    first seconds. Frozen, a full collection walks only what was made since. Call it once startup is
    done; returns how long the last full collection of the startup heap took (what each one would cost).
    """
    start = time.perf_counter()
    gc.collect()
    collect_s = time.perf_counter() - start
    gc.freeze()
    logger.info(
        "%d startup objects frozen out of the garbage collector (a full collection of them took %.0f ms)",
        gc.get_freeze_count(),
        collect_s * 1000,
    )
    return collect_s
