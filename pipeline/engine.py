"""The render engine: one per process, owns the backend (and its device), batches across sessions.

Sessions submit one :class:`RenderItem` per video frame and get a :class:`concurrent.futures.Future`. A single
worker thread takes everything pending (from all sessions, in arrival order), pads it to the smallest fixed
batch size that holds it, renders it in one backend call and hands each session its own patches. There is no
waiting to fill a batch: while one batch runs the next one accumulates, so a lightly loaded engine answers
at batch 1 and a loaded one batches automatically ("continuous batching").

Fixed batch sizes keep every shape seen at run time also seen at warm-up (cuDNN autotuning, CUDA graphs).

Only the worker calls the backend while it runs. Work that must touch the backend at run time (adding an
avatar that a user just uploaded) is queued to the worker as a command, which overtakes queued frames and
runs between two batches.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import LipSyncBackend, RenderedPatch, RenderItem
from lipcast.pipeline.enhance.options import sharpen_device
from lipcast.pipeline.warmup import WARMUP_TIMED_RENDERS, time_batch_sizes

logger = logging.getLogger(__name__)


class EngineStoppedError(RuntimeError):
    """The engine is not running."""


class DeadlineExpiredError(RuntimeError):
    """The frame's presentation time passed before the engine reached it; it was not rendered."""


@dataclass
class _Pending:
    session_id: str
    item: RenderItem
    future: Future[RenderedPatch]
    submitted_s: float
    deadline_s: float | None


@dataclass
class _Command:
    run: Callable[[], None]
    future: Future[None]


@dataclass
class EngineStats:
    """Counters read by metrics; updated by the worker thread (and under the engine's lock)."""

    batches: int = 0
    frames: int = 0
    padded_frames: int = 0
    failed_batches: int = 0
    expired: int = 0  # requests dropped because their deadline passed while queued
    cancelled: int = 0  # requests cancelled before rendering (their session ended)
    busy_s: float = 0.0
    batch_size_counts: dict[int, int] = field(default_factory=dict)
    last_batch_ms: float = 0.0


def bucket_for(count: int, batch_sizes: Sequence[int]) -> int:
    """The smallest batch size that holds ``count`` items (``batch_sizes`` ascending)."""
    for size in batch_sizes:
        if size >= count:
            return size
    return batch_sizes[-1]


class RenderEngine:
    """Batches render requests from every session onto one backend, on one worker thread."""

    def __init__(
        self,
        backend: LipSyncBackend,
        batch_sizes: Sequence[int],
        *,
        clock: Callable[[], float] = time.monotonic,
        worker_niceness: int = 0,
        device: str = "",
    ) -> None:
        """``batch_sizes``: the fixed batch buckets (:func:`lipcast.pipeline.defaults.default_batch_sizes`
        picks them per device). ``device`` names the backend's device (``"cuda:1"``); on CUDA the worker
        thread makes it its current device, so that one engine per GPU renders on its own.

        ``worker_niceness`` > 0 lowers the worker thread's CPU priority (Linux: per thread): on a CPU
        device rendering is best effort (a late frame is repeated) while the media clock must never stall."""
        sizes = tuple(sorted(set(batch_sizes)))
        if not sizes or sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive, got {batch_sizes!r}")
        self.backend = backend
        self.batch_sizes = sizes
        self.stats = EngineStats()
        self._clock = clock
        self._queue: deque[_Pending] = deque()
        self._commands: deque[_Command] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._avatars: dict[str, Avatar] = {}
        self.warmup_s: float | None = None
        self.worker_niceness = worker_niceness
        self.device = device

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="render-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker; pending requests fail with :class:`EngineStoppedError`."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._fail_all(EngineStoppedError("render engine stopped"))

    # -- avatars and warm-up --------------------------------------------------------------------------------

    def add_avatar(self, avatar: Avatar) -> None:
        """Prepare ``avatar`` on the backend; returns when frames of it can be submitted.

        Safe from any thread at any time: while the worker runs it does this between two batches (the
        caller blocks until then, so call it from a worker thread, not the event loop).
        """
        self._on_worker(lambda: self._add_avatar(avatar))

    def _add_avatar(self, avatar: Avatar) -> None:
        self.backend.add_avatar(avatar)
        self._avatars[avatar.name] = avatar

    def _on_worker(self, run: Callable[[], None]) -> None:
        """Run ``run`` on the worker thread when it is running (waiting for it), else here and now."""
        future: Future[None] = Future()
        with self._cond:
            if self._stopping:
                raise EngineStoppedError("render engine is stopping")
            queued = self.running and threading.current_thread() is not self._thread
            if queued:
                self._commands.append(_Command(run, future))
                self._cond.notify()
        if not queued:
            run()
            return
        future.result()

    def has_avatar(self, name: str) -> bool:
        return name in self._avatars

    def warmup(self, repeats: int = WARMUP_TIMED_RENDERS) -> dict[int, float]:
        """Render one batch of every size once (autotuning, graph capture, compilation), then ``repeats``
        more times. Returns ms per size: the median of the repeats (the steady render time), or with
        ``repeats`` 0 the time of the first render."""
        if not self._avatars:
            raise RuntimeError("add an avatar before warming up the engine")
        avatar = next(iter(self._avatars.values()))
        conditioning = np.zeros(self.backend.conditioning_shape, dtype=np.float32)
        start = self._clock()
        check_fp16 = getattr(self.backend, "check_fp16", None)  # MuseTalk: fp32 if fp16 would overflow
        if callable(check_fp16):
            check_fp16()
        # With a sharpen stage every row of the timed batches runs it too: the render budget measured from
        # these timings then holds a batch of sharpened calls (the slowest a batch can be).
        strength = 1.0 if sharpen_device(self.backend) is not None else 0.0
        timings = time_batch_sizes(
            self.backend.render,
            avatar.name,
            avatar.frame_count,
            conditioning,
            self.batch_sizes,
            repeats,
            enhance_strength=strength,
        )
        self.warmup_s = self._clock() - start
        logger.info("engine warm-up: %s", ", ".join(f"b{k}={v:.1f}ms" for k, v in timings.items()))
        return timings

    # -- submission -------------------------------------------------------------------------------------

    def submit(
        self, session_id: str, item: RenderItem, deadline_s: float | None = None
    ) -> Future[RenderedPatch]:
        """Queue one frame; the future resolves with its patch (or the batch's exception).

        ``deadline_s`` (on the engine's clock) is when the frame is presented: a request still queued then
        fails with :class:`DeadlineExpiredError` instead of being rendered, so an engine that falls behind
        drops work rather than letting queues and latency grow.
        """
        future: Future[RenderedPatch] = Future()
        with self._cond:
            if self._stopping or not self.running:
                future.set_exception(EngineStoppedError("render engine is not running"))
                return future
            self._queue.append(_Pending(session_id, item, future, self._clock(), deadline_s))
            self._cond.notify()
        return future

    def cancel_session(self, session_id: str) -> int:
        """Drop a session's queued requests (a session that ended). Returns how many were dropped."""
        with self._cond:
            kept = deque(p for p in self._queue if p.session_id != session_id)
            dropped = [p for p in self._queue if p.session_id == session_id]
            self._queue = kept
            self.stats.cancelled += len(dropped)
        for pending in dropped:
            pending.future.cancel()
        return len(dropped)

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._queue)

    # -- worker ---------------------------------------------------------------------------------------------

    def _take_work(self) -> tuple[list[_Command], list[_Pending]] | None:
        """Commands first (they overtake frames), else a batch; None when stopping."""
        with self._cond:
            while not self._queue and not self._commands and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            if self._commands:
                commands = list(self._commands)
                self._commands.clear()
                return commands, []
            limit = self.batch_sizes[-1]
            now = self._clock()
            batch: list[_Pending] = []
            expired: list[_Pending] = []
            while self._queue and len(batch) < limit:
                pending = self._queue.popleft()
                if not pending.future.set_running_or_notify_cancel():
                    self.stats.cancelled += 1
                    continue
                late = pending.deadline_s is not None and pending.deadline_s <= now
                (expired if late else batch).append(pending)
        if expired:
            self.stats.expired += len(expired)
            for pending in expired:
                pending.future.set_exception(DeadlineExpiredError("frame deadline passed before rendering"))
        return [], batch

    def _run_commands(self, commands: list[_Command]) -> None:
        for command in commands:
            if not command.future.set_running_or_notify_cancel():
                continue
            try:
                command.run()
            except Exception as e:  # reported to the caller, who waits on it
                command.future.set_exception(e)
            else:
                command.future.set_result(None)

    def _lower_priority(self) -> None:
        if self.worker_niceness <= 0 or not hasattr(os, "setpriority"):
            return
        try:  # on Linux PRIO_PROCESS with a thread id sets that thread's niceness alone
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.worker_niceness)
        except OSError as e:
            logger.warning("could not lower the render thread's priority: %s", e)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # a bug or a lost device: said loudly, and no frame waits for this thread
            logger.exception("render engine %s failed; frames fall back to idle until a restart", self.device)
            self._fail_all(EngineStoppedError(f"render engine failed: {e}"))

    def _serve(self) -> None:
        self._lower_priority()
        if self.device.startswith("cuda"):
            import torch

            device = torch.device(self.device)
            if device.index is not None:  # plain "cuda": whichever is current (device 0 in a new thread)
                torch.cuda.set_device(device)
        while True:
            work = self._take_work()
            if work is None:
                return
            commands, batch = work
            self._run_commands(commands)
            if batch:
                self._render(batch)

    def _render(self, batch: list[_Pending]) -> None:
        size = bucket_for(len(batch), self.batch_sizes)
        items = [p.item for p in batch]
        items.extend(items[-1] for _ in range(size - len(batch)))
        t0 = self._clock()
        try:
            patches = self.backend.render(items)
        except Exception as e:  # one bad batch must not take the engine (or other batches) down
            logger.exception("render batch of %d failed", len(batch))
            self.stats.failed_batches += 1
            for pending in batch:
                pending.future.set_exception(e)
            return
        elapsed_s = self._clock() - t0
        stats = self.stats
        stats.batches += 1
        stats.frames += len(batch)
        stats.padded_frames += size - len(batch)
        stats.busy_s += elapsed_s
        stats.last_batch_ms = elapsed_s * 1000.0
        stats.batch_size_counts[size] = stats.batch_size_counts.get(size, 0) + 1
        for pending, patch in zip(batch, patches, strict=False):
            pending.future.set_result(patch)

    def _fail_all(self, error: Exception) -> None:
        with self._cond:
            pending = list(self._queue)
            self._queue.clear()
            commands = list(self._commands)
            self._commands.clear()
        for p in pending:
            if not p.future.done():
                p.future.set_exception(error)
        for command in commands:
            if not command.future.done():
                command.future.set_exception(error)
