"""What the front hands a media worker when it starts it (picklable; imported by the front and the worker)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection

from pipeline.backend import Featurizer, LipSyncBackend
from pipeline.engine_link.ring import RingLayout
from server.config import Settings

ENGINE = "engine"  # frames go to the front's engine through shared memory
WORKER = "worker"  # each worker renders on a CPU engine of its own


@dataclass(frozen=True)
class BackendInfo:
    """The backend as a worker sees it when the engine renders elsewhere: timing and a fresh featurizer."""

    name: str
    conditioning_shape: tuple[int, ...]
    lookahead_ms: float
    crossfade_frames: int
    featurizer: bytes  # a pickled fresh featurizer; each session gets its own copy

    @classmethod
    def of(cls, backend: LipSyncBackend) -> BackendInfo:
        return cls(
            backend.name,
            tuple(backend.conditioning_shape),
            float(backend.lookahead_ms),
            int(backend.crossfade_frames),
            pickle.dumps(backend.new_featurizer()),
        )


class LinkedBackend:
    """A :class:`~pipeline.backend.LipSyncBackend` for a worker's sessions whose frames the front renders."""

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

    def new_featurizer(self) -> Featurizer:
        featurizer: Featurizer = pickle.loads(self.info.featurizer)  # noqa: S301 -- our own bytes, from the front
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
