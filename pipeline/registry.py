"""The avatars a server offers: loaded, given their idle loop, and prepared on the render engine.

:class:`AvatarRegistry` is a read-only mapping (name -> :class:`~lipcast.pipeline.avatar.Avatar`) for the
sessions and handlers, and :meth:`AvatarRegistry.add` publishes a new avatar at any time, from any thread: the
engine prepares it first (on its worker, between batches), and only then does the name appear, so a call can
never pick an avatar the engine does not have. Readers see an immutable snapshot; writers replace it under a
lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

from lipcast.pipeline.avatar import Avatar, load_avatar
from lipcast.pipeline.idle import with_idle_motion

logger = logging.getLogger(__name__)


class AvatarPreparer(Protocol):
    """What prepares avatars for rendering: the render engine (or, in a media worker, its link to it)."""

    def add_avatar(self, avatar: Avatar) -> None: ...


class AvatarRegistry(Mapping[str, Avatar]):
    def __init__(self, engine: AvatarPreparer) -> None:
        self.engine = engine
        self._avatars: dict[str, Avatar] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Avatar:
        return self._avatars[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._avatars)

    def __len__(self) -> int:
        return len(self._avatars)

    def add(self, avatar: Avatar) -> Avatar:
        """Give ``avatar`` its idle loop, prepare it on the engine, then offer it. Returns what is served.

        Blocks while the engine prepares it: call it from a worker thread once the engine runs.
        """
        served = with_idle_motion(avatar)
        self.engine.add_avatar(served)
        with self._lock:
            self._avatars = {**self._avatars, served.name: served}
        logger.info(
            "avatar %r offered (%d frames, %dx%d)",
            served.name,
            served.frame_count,
            served.width,
            served.height,
        )
        return served

    def add_directory(self, root: Path) -> Avatar:
        """Load, validate and :meth:`add` the avatar stored in ``root``."""
        return self.add(load_avatar(root))
