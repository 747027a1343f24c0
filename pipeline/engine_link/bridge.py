"""Runs in the **engine's process** (the front): serves one media worker's link on the shared render engine.

An :class:`EngineBridge` owns one worker's ring (it creates the shared memory block) and the engine end of
its pipe. A reader thread takes each note, reads the request out of its slot and submits it to the
:class:`~lipcast.pipeline.engine.RenderEngine` under a session id qualified by the link (``"w3/abc..."``), so
frames of all workers queue, batch and expire together, each with its own deadline. When a frame's future
resolves (on the engine's worker thread) its patch is written into the slot's response record and a note goes
back.

A worker that dies closes its pipe: the bridge then cancels every frame of that worker still queued in the
engine, and :meth:`close` frees the shared memory. Other links are untouched.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection

from lipcast.pipeline.backend import RenderedPatch
from lipcast.pipeline.engine import DeadlineExpiredError, RenderEngine
from lipcast.pipeline.engine_link.ring import (
    CANCEL_SESSION,
    CANCELLED,
    DONE,
    EXPIRED,
    FAILED,
    SUBMIT,
    Ring,
    RingError,
    RingLayout,
    hang_up,
    note,
    received_notes,
)

logger = logging.getLogger(__name__)


class EngineBridge:
    """The engine side of one media worker's link."""

    def __init__(
        self,
        engine: RenderEngine,
        layout: RingLayout,
        conn: Connection,
        link_id: str,
        *,
        on_closed: Callable[[EngineBridge], None] | None = None,
    ) -> None:
        self.engine = engine
        self.layout = layout
        self.conn = conn
        self.link_id = link_id
        self.ring = Ring(layout, create=True)
        self.on_closed = on_closed
        self.frames = 0
        self.failed = 0
        self._sessions: set[str] = set()
        self._send_lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def shm_name(self) -> str:
        return self.ring.name

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name=f"engine-bridge-{self.link_id}", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stop serving: drop the worker's queued frames, close the pipe, free the shared memory."""
        self._closed.set()
        hang_up(self.conn)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._forget_sessions()
        self.ring.close()

    def _engine_id(self, session_id: str) -> str:
        return f"{self.link_id}/{session_id}"

    def _serve(self) -> None:
        try:
            for kind, arg in received_notes(self.conn):
                if kind == SUBMIT and isinstance(arg, int):
                    self._submit(arg)
                elif kind == CANCEL_SESSION and isinstance(arg, str):
                    self.engine.cancel_session(self._engine_id(arg))
                    self._sessions.discard(arg)
        except Exception:  # a corrupt request: this link cannot be trusted; the others go on
            logger.exception("[%s] engine link failed", self.link_id)
        finally:
            self._closed.set()
            self._forget_sessions()
            if self.on_closed is not None:
                self.on_closed(self)

    def _forget_sessions(self) -> None:
        for session_id in list(self._sessions):
            self.engine.cancel_session(self._engine_id(session_id))
        self._sessions.clear()

    def _submit(self, slot: int) -> None:
        try:
            session_id, item, deadline_s = self.ring.read_request(slot)
        except (RingError, UnicodeDecodeError):
            logger.exception("[%s] unreadable request in slot %d", self.link_id, slot)
            self._reply(note(FAILED, slot))
            return
        self._sessions.add(session_id)
        future = self.engine.submit(self._engine_id(session_id), item, deadline_s)
        future.add_done_callback(functools.partial(self._finished, slot))

    def _finished(self, slot: int, future: Future[RenderedPatch]) -> None:
        if self._closed.is_set():
            return
        if future.cancelled():
            self._reply(note(CANCELLED, slot))
            return
        error = future.exception()
        if isinstance(error, DeadlineExpiredError):
            self._reply(note(EXPIRED, slot))
            return
        if error is not None:
            self.failed += 1
            self._reply(note(FAILED, slot))
            return
        try:
            self.ring.write_patch(slot, future.result())
        except Exception as e:  # a patch larger than the record, or the link closed meanwhile
            if self._closed.is_set():
                return
            self.failed += 1
            logger.warning("[%s] patch not sent: %s", self.link_id, e)
            self._reply(note(FAILED, slot))
            return
        self.frames += 1
        self._reply(note(DONE, slot))

    def _reply(self, message: bytes) -> None:
        try:
            with self._send_lock:
                self.conn.send_bytes(message)
        except (OSError, ValueError):  # the worker is gone; its sessions are being forgotten
            pass
