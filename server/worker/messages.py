"""Every message between the front and a media worker, in one place (imported by both processes).

* At spawn: :class:`WorkerSpec`, pickled by ``multiprocessing`` (the settings, the worker's Unix socket, its
  end of the engine link and the backend as the worker sees it).
* While it runs: the front forwards the ordinary HTTP API (``/offer``, ``/whip``, ``/sessions/...``) to the
  worker's socket unchanged, and polls :data:`STATE_PATH`, answered with a :class:`WorkerState`.
* Per frame, when the front's engine renders: the shared-memory ring of :mod:`lipcast.pipeline.engine_link`.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypedDict

from lipcast.pipeline.backend import Featurizer, LipSyncBackend
from lipcast.pipeline.engine_link.ring import RingLayout
from lipcast.pipeline.enhance.options import sharpen_device
from lipcast.server.config import Settings

ENGINE = "engine"  # frames go to the front's engine through shared memory
WORKER = "worker"  # each worker renders on a CPU engine of its own
STATE_PATH = "/_worker/state"  # the front's health check and bookkeeping poll


class WorkerState(TypedDict, total=False):
    """``GET /_worker/state``: answering at all proves liveness; the rest once the runtime exists."""

    index: int
    pid: int
    process_cpu_s: float
    cpu: dict[str, Any]  # lipcast.streaming.cpu_usage.cpu_snapshot
    ready: bool  # taking calls: warmed up, not draining, the engine (or its link) running
    draining: bool
    sessions: list[str]  # the ids of the sessions it owns
    frames_sent_total: int
    created_total: int
    link: dict[str, Any]  # the engine link's counters (lipcast.pipeline.engine_link.client.LinkStats)


@dataclass(frozen=True)
class BackendInfo:
    """The backend as a worker sees it when the engine renders elsewhere: timing and a fresh featurizer."""

    name: str
    conditioning_shape: tuple[int, ...]
    lookahead_ms: float
    crossfade_frames: int
    featurizer: bytes  # a pickled fresh featurizer; each session gets its own copy
    sharpen_device: str | None = None  # where the engine's sharpen stage runs; None: it has none

    @classmethod
    def of(cls, backend: LipSyncBackend) -> BackendInfo:
        return cls(
            backend.name,
            tuple(backend.conditioning_shape),
            float(backend.lookahead_ms),
            int(backend.crossfade_frames),
            pickle.dumps(backend.new_featurizer()),
            sharpen_device(backend),
        )


class LinkedBackend:
    """A :class:`~lipcast.pipeline.backend.LipSyncBackend` for a worker's sessions whose frames the front
    renders."""

    def __init__(self, info: BackendInfo) -> None:
        self.info = info
        self.name = info.name

    @property
    def conditioning_shape(self) -> tuple[int, ...]:
        return self.info.conditioning_shape

    @property
    def lookahead_ms(self) -> float:
        return self.info.lookahead_ms

    @property
    def crossfade_frames(self) -> int:
        return self.info.crossfade_frames

    @property
    def sharpen_device(self) -> str | None:
        return self.info.sharpen_device

    def new_featurizer(self) -> Featurizer:
        # our own bytes, from the front
        featurizer: Featurizer = pickle.loads(self.info.featurizer)  # noqa: S301
        return featurizer

    def add_avatar(self, avatar: object) -> None:
        """The engine's process prepares avatars."""

    def remove_avatar(self, name: str) -> None:
        """The engine's process holds the prepared avatars."""

    def render(self, items: object) -> list[object]:
        raise RuntimeError("a media worker does not render: frames go to the front's engine")


@dataclass(frozen=True)
class EngineLinkSpec:
    layout: RingLayout
    shm_name: str
    conn: Connection  # the worker's end of the notification pipe (passed at spawn)


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    settings: Settings  # the server's, with media_workers=1
    socket_path: str
    parent_pid: int
    render_in: str  # ENGINE or WORKER
    link: EngineLinkSpec | None = None
    backend: BackendInfo | None = None
