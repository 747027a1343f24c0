"""Runs in a **media worker**: the ``Renderer`` its sessions submit frames to, backed by the shared engine.

:class:`SharedRenderer` has the render engine's submission interface (``submit`` returns a
:class:`concurrent.futures.Future` of the patch, ``cancel_session`` drops a session's frames), so the
worker's sessions run unchanged. ``submit`` takes a free slot, writes the request into shared memory and
sends a 5-byte note; a reader thread receives the engine side's answers, copies each patch out of its slot,
frees the slot and resolves the future. A frame the engine dropped at its deadline fails with
:class:`~lipcast.pipeline.engine.DeadlineExpiredError`, exactly as from a local engine.

When the engine side goes away (the pipe closes), every pending frame fails with
:class:`~lipcast.pipeline.engine.EngineStoppedError`, ``running`` turns False and ``on_lost`` is called.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from multiprocessing.connection import Connection

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.engine import DeadlineExpiredError, EngineStats, EngineStoppedError
from lipcast.pipeline.engine_link.ring import (
    CANCELLED,
    DONE,
    EXPIRED,
    SUBMIT,
    Ring,
    RingError,
    RingLayout,
    cancel_note,
    hang_up,
    note,
    received_notes,
)

logger = logging.getLogger(__name__)


class RingFullError(RuntimeError):
    """Every slot of the link holds a frame in flight; this frame is not rendered."""


class EngineRenderError(RuntimeError):
    """The engine side could not render this frame (its batch raised, or the patch did not fit)."""


@dataclass
class _InFlight:
    session_id: str
    future: Future[RenderedPatch]


@dataclass
class LinkStats:
    submitted: int = 0
    done: int = 0
    expired: int = 0
    failed: int = 0
    cancelled: int = 0
    ring_full: int = 0
    in_flight_max: int = 0


class SharedRenderer:
    """A media worker's handle on the shared render engine."""

    def __init__(
        self,
        layout: RingLayout,
        shm_name: str,
        conn: Connection,
        *,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.ring = Ring(layout, shm_name)
        self.layout = layout
        self.conn = conn
        self.on_lost = on_lost
        self.link_stats = LinkStats()
        self.stats = EngineStats()  # the engine's own counters live in its process; these stay zero
        self.batch_sizes: tuple[int, ...] = ()
        self.warmup_s: float | None = None
        self._free: deque[int] = deque(range(layout.slots))
        self._in_flight: dict[int, _InFlight] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._lost = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._lost

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._read_answers, name="engine-link", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Close the link: pending frames fail; the engine side sees the pipe close and forgets them."""
        self._stopping = True  # an ending asked for here: not a lost engine
        hang_up(self.conn)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._fail_all(EngineStoppedError("link to the render engine closed"))
        self.ring.close()

    # -- what sessions call ---------------------------------------------------------------------------------

    def add_avatar(self, avatar: Avatar) -> None:
        """Nothing to do here: the engine's process prepares every avatar it serves."""

    def submit(
        self, session_id: str, item: RenderItem, deadline_s: float | None = None
    ) -> Future[RenderedPatch]:
        future: Future[RenderedPatch] = Future()
        if self._lost:
            future.set_exception(EngineStoppedError("the render engine is gone"))
            return future
        with self._lock:
            if not self._free:
                self.link_stats.ring_full += 1
                future.set_exception(RingFullError(f"all {self.layout.slots} engine slots are in flight"))
                return future
            slot = self._free.popleft()
            self._in_flight[slot] = _InFlight(session_id, future)
            self.link_stats.submitted += 1
            self.link_stats.in_flight_max = max(self.link_stats.in_flight_max, len(self._in_flight))
        try:
            self.ring.write_request(slot, session_id, item, deadline_s)
            self._send(note(SUBMIT, slot))
        except (RingError, OSError, ValueError) as e:
            with self._lock:
                self._in_flight.pop(slot, None)
                self._free.append(slot)
            if not future.done():
                future.set_exception(EngineStoppedError(f"could not send the frame: {e}"))
        return future

    def cancel_session(self, session_id: str) -> int:
        """Cancel the session's frames here and ask the engine to drop them (their slots come back when the
        engine side answers them)."""
        with self._lock:
            pending = [f.future for f in self._in_flight.values() if f.session_id == session_id]
        for future in pending:
            future.cancel()
        if pending and not self._lost:
            try:
                self._send(cancel_note(session_id))
            except (OSError, ValueError):
                pass
        return len(pending)

    @property
    def queue_depth(self) -> int:
        with self._lock:
            return len(self._in_flight)

    # -- reader thread --------------------------------------------------------------------------------------

    def _send(self, message: bytes) -> None:
        with self._send_lock:
            self.conn.send_bytes(message)

    def _read_answers(self) -> None:
        try:
            for kind, slot in received_notes(self.conn):
                if isinstance(slot, int):
                    self._answer(kind, slot)
        except Exception:  # a corrupt note: the link cannot be trusted any more
            logger.exception("engine link failed")
        finally:
            self._lost = True
            self._fail_all(EngineStoppedError("the render engine is gone"))
            if self.on_lost is not None and not self._stopping:
                self.on_lost()

    def _answer(self, kind: bytes, slot: int) -> None:
        patch: RenderedPatch | None = None
        error: BaseException | None = None
        stats = self.link_stats
        if kind == DONE:
            try:
                patch = self.ring.read_patch(slot)
                stats.done += 1
            except RingError as e:
                error = EngineRenderError(str(e))
        elif kind == EXPIRED:
            stats.expired += 1
            error = DeadlineExpiredError("frame deadline passed before rendering")
        elif kind == CANCELLED:
            stats.cancelled += 1
            error = None
        else:
            stats.failed += 1
            error = EngineRenderError("the engine could not render this frame")
        with self._lock:
            flight = self._in_flight.pop(slot, None)
            if flight is not None:
                self._free.append(slot)
        if flight is None:
            logger.warning("answer for slot %d, which holds no frame", slot)
            return
        future = flight.future
        try:
            if patch is not None:
                future.set_result(patch)
            elif error is not None:
                future.set_exception(error)
            else:
                future.cancel()
        except InvalidStateError:  # cancelled here meanwhile (the session ended)
            pass

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            flights = list(self._in_flight.values())
            self._in_flight.clear()
            self._free = deque(range(self.layout.slots))
        for flight in flights:
            try:
                flight.future.set_exception(error)
            except InvalidStateError:
                pass
