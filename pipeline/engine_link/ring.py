"""Shared-memory layout of one media worker's link to the render engine (imported by both processes).

One :class:`multiprocessing.shared_memory.SharedMemory` block holds ``slots`` request records followed by
``slots`` response records; request ``k`` is answered in response ``k``. The worker owns a slot from the
moment it writes a request until it reads the answer, so neither side ever writes a record the other is
reading, and no lock spans the processes.

Request record (``REQUEST_HEADER`` then the conditioning)::

    session id   16 bytes, utf-8, NUL-padded (lipcast session ids are 12 characters)
    avatar       64 bytes, utf-8, NUL-padded
    frame index  int32
    deadline_s   float64 on CLOCK_MONOTONIC (NaN: none); the same clock in every process on Linux
    enhance      float32, the item's face post-processing strength (0: off)
    conditioning float32 x conditioning_size

Response record: top, left, height, width (4 x int32), then ``max_patch_bytes`` of RGB pixels.

Notifications (a :class:`multiprocessing.connection.Connection`, ``send_bytes``): a kind byte and a slot
(``NOTE``), or a kind byte and a session id (``CANCEL``).
"""

from __future__ import annotations

import math
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import shared_memory
from multiprocessing.connection import Connection

import numpy as np

from lipcast.pipeline.backend import FloatArray, RenderedPatch, RenderItem, UInt8Array

REQUEST_HEADER = struct.Struct("<16s64sidf")  # session, avatar, frame index, deadline, enhance (92 bytes)
RESPONSE_HEADER = struct.Struct("<iiiiii")  # top, left, height, width, box height, box width (0: none)
NOTE = struct.Struct("<cI")  # kind, slot
CANCEL = struct.Struct("<c16s")  # b"C", session id
ALIGN = 64
MAX_SESSION_ID_BYTES = 16
MAX_AVATAR_NAME_BYTES = 64

# worker -> engine
SUBMIT = b"R"
CANCEL_SESSION = b"C"
# engine -> worker
DONE = b"D"
EXPIRED = b"E"
FAILED = b"F"
CANCELLED = b"X"


class RingError(RuntimeError):
    """A request or patch that does not fit the link's fixed records."""


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class RingLayout:
    """Sizes of one link; picklable, sent to the worker at spawn together with the block's name."""

    slots: int
    conditioning_shape: tuple[int, ...]
    max_patch_bytes: int

    @property
    def conditioning_size(self) -> int:
        return math.prod(self.conditioning_shape)

    @property
    def request_bytes(self) -> int:
        return _aligned(REQUEST_HEADER.size + 4 * self.conditioning_size)

    @property
    def response_bytes(self) -> int:
        return _aligned(RESPONSE_HEADER.size + self.max_patch_bytes)

    @property
    def total_bytes(self) -> int:
        return self.slots * (self.request_bytes + self.response_bytes)


def _text(value: str, limit: int, what: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > limit:
        raise RingError(f"{what} {value!r} is longer than {limit} bytes")
    return raw


def _untext(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8")


class Ring:
    """One link's shared memory, opened by the engine side (``create=True``) or the worker side."""

    def __init__(self, layout: RingLayout, name: str | None = None, *, create: bool = False) -> None:
        self.layout = layout
        if create:
            self.shm = shared_memory.SharedMemory(name=name, create=True, size=layout.total_bytes)
        else:
            if name is None:
                raise ValueError("name the shared memory block to attach to")
            # A worker started by the front shares the front's resource tracker, so attaching registers
            # nothing new there and the block is removed by its creator (or at the front's exit) only.
            self.shm = shared_memory.SharedMemory(name=name)
        self.name = self.shm.name
        self._owner = create
        buf = self.shm.buf
        if buf is None:
            raise RingError(f"shared memory block {self.name} is not mapped")
        self._requests_end = layout.slots * layout.request_bytes
        self._buf: memoryview = buf

    def _request_at(self, slot: int) -> int:
        if not 0 <= slot < self.layout.slots:
            raise RingError(f"slot {slot} out of range")
        return slot * self.layout.request_bytes

    def _response_at(self, slot: int) -> int:
        if not 0 <= slot < self.layout.slots:
            raise RingError(f"slot {slot} out of range")
        return self._requests_end + slot * self.layout.response_bytes

    # -- requests (written by the worker, read by the engine side) ------------------------------------------

    def write_request(self, slot: int, session_id: str, item: RenderItem, deadline_s: float | None) -> None:
        layout = self.layout
        conditioning = np.asarray(item.conditioning, dtype=np.float32)
        if conditioning.size != layout.conditioning_size:
            raise RingError(
                f"conditioning of {conditioning.size} values; the link carries {layout.conditioning_size}"
            )
        at = self._request_at(slot)
        REQUEST_HEADER.pack_into(
            self._buf,
            at,
            _text(session_id, MAX_SESSION_ID_BYTES, "session id"),
            _text(item.avatar, MAX_AVATAR_NAME_BYTES, "avatar name"),
            item.frame_index,
            math.nan if deadline_s is None else deadline_s,
            item.enhance_strength,
        )
        view = np.ndarray(
            (layout.conditioning_size,), np.float32, buffer=self._buf, offset=at + REQUEST_HEADER.size
        )
        view[:] = conditioning.reshape(-1)

    def read_request(self, slot: int) -> tuple[str, RenderItem, float | None]:
        """The request in ``slot``, its conditioning copied out (the slot is reused once answered)."""
        layout = self.layout
        at = self._request_at(slot)
        session, avatar, frame_index, deadline, enhance = REQUEST_HEADER.unpack_from(self._buf, at)
        conditioning: FloatArray = np.ndarray(
            layout.conditioning_shape, np.float32, buffer=self._buf, offset=at + REQUEST_HEADER.size
        ).copy()
        item = RenderItem(_untext(avatar), int(frame_index), conditioning, enhance_strength=float(enhance))
        return _untext(session), item, None if math.isnan(deadline) else float(deadline)

    # -- responses (written by the engine side, read by the worker) -----------------------------------------

    def write_patch(self, slot: int, patch: RenderedPatch) -> None:
        pixels = patch.pixels
        if pixels.ndim != 3 or pixels.shape[2] != 3:
            raise RingError(f"a patch must be (h, w, 3) RGB, got {pixels.shape}")
        h, w = int(pixels.shape[0]), int(pixels.shape[1])
        if h * w * 3 > self.layout.max_patch_bytes:
            raise RingError(f"a {w}x{h} patch is larger than the link's {self.layout.max_patch_bytes} bytes")
        at = self._response_at(slot)
        box_h, box_w = patch.box or (0, 0)
        RESPONSE_HEADER.pack_into(self._buf, at, patch.top, patch.left, h, w, box_h, box_w)
        view = np.ndarray((h, w, 3), np.uint8, buffer=self._buf, offset=at + RESPONSE_HEADER.size)
        np.copyto(view, pixels, casting="unsafe")

    def read_patch(self, slot: int) -> RenderedPatch:
        at = self._response_at(slot)
        top, left, h, w, box_h, box_w = RESPONSE_HEADER.unpack_from(self._buf, at)
        if h < 0 or w < 0 or h * w * 3 > self.layout.max_patch_bytes:
            raise RingError(f"corrupt response in slot {slot}: {w}x{h}")
        pixels: UInt8Array = np.ndarray(
            (h, w, 3), np.uint8, buffer=self._buf, offset=at + RESPONSE_HEADER.size
        ).copy()
        box = (int(box_h), int(box_w)) if box_h > 0 and box_w > 0 else None
        return RenderedPatch(pixels, int(top), int(left), box)

    def close(self) -> None:
        """Unmap (and, on the creating side, remove) the block."""
        self._buf = memoryview(b"")
        try:
            self.shm.close()
        except BufferError:  # a view is still exported somewhere; the mapping goes with the process
            pass
        if self._owner:
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass
            self._owner = False


def note(kind: bytes, slot: int) -> bytes:
    return NOTE.pack(kind, slot)


def cancel_note(session_id: str) -> bytes:
    return CANCEL.pack(CANCEL_SESSION, _text(session_id, MAX_SESSION_ID_BYTES, "session id"))


def parse_note(message: bytes) -> tuple[bytes, int | str]:
    """``(kind, slot)`` for slot notes, ``(b"C", session_id)`` for a cancel."""
    if len(message) == CANCEL.size and message[:1] == CANCEL_SESSION:
        kind, session = CANCEL.unpack(message)
        return kind, _untext(session)
    if len(message) != NOTE.size:
        raise RingError(f"unexpected notification of {len(message)} bytes")
    kind, slot = NOTE.unpack(message)
    return kind, int(slot)


def hang_up(conn: Connection) -> None:
    """Close a duplex pipe so that both ends see it at once: a reader blocked on it here wakes up with
    ``EOFError`` and the other process reads EOF (a plain ``close`` waits for the blocked read)."""
    try:
        with socket.socket(fileno=socket.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, ValueError):  # closed already, or not a socket
        pass
    try:
        conn.close()
    except OSError:
        pass


def received_notes(conn: Connection) -> Iterator[tuple[bytes, int | str]]:
    """Each note that arrives on ``conn``, parsed (:func:`parse_note`), until the other end closes it."""
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError, TypeError):  # TypeError: closed under the reader
            return
        yield parse_note(message)
