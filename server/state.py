"""What the handlers share: the settings and the runtime, under typed application keys."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from aiohttp import web

from lipcast.pipeline.backend import LipSyncBackend
from lipcast.pipeline.engine import RenderEngine
from lipcast.pipeline.engine_group import EngineGroup
from lipcast.pipeline.engine_link.client import SharedRenderer
from lipcast.pipeline.registry import AvatarRegistry
from lipcast.server.capacity import STARTING_RETRY_AFTER_S
from lipcast.server.config import Settings
from lipcast.server.errors import ServiceUnavailableError
from lipcast.server.metrics import Metrics
from lipcast.server.sessions import SessionManager
from lipcast.streaming.clock import Clock


@dataclass
class Runtime:
    """The long-lived parts the handlers use; built at startup, torn down at cleanup."""

    settings: Settings
    backend: LipSyncBackend
    # one device's engine, one per device (several GPUs), or a media worker's link to the front's engine
    engine: RenderEngine | EngineGroup | SharedRenderer
    avatars: AvatarRegistry
    sessions: SessionManager
    device: dict[str, Any]
    ready: bool = False  # warmed up and serving (stays True while draining, so calls can be ended)
    started_s: float = field(default_factory=time.monotonic)

    @property
    def draining(self) -> bool:
        return self.sessions.draining

    def readiness(self) -> tuple[bool, str]:
        """Whether a new call would be taken now, and why not."""
        if not self.ready:
            return False, "warming up"
        if self.draining:
            return False, "draining"
        if not self.engine.running:
            return False, "render engine stopped"
        if len(self.sessions) >= self.settings.max_sessions:
            return False, "no session capacity left"
        return True, "ready"

    def is_ready(self) -> bool:
        return self.readiness()[0]

    def gpu_memory_bytes(self) -> int | None:
        if not str(self.device.get("device", "")).startswith("cuda"):
            return None
        return int(torch.cuda.memory_allocated(torch.device(self.device["device"])))


SETTINGS = web.AppKey("settings", Settings)
RUNTIME = web.AppKey("runtime", Runtime)
CLOCK = web.AppKey("clock", Clock)
METRICS = web.AppKey("metrics", Metrics)


def runtime_of(request: web.Request) -> Runtime:
    """The runtime, or 503 while the server is starting or draining."""
    runtime = request.app.get(RUNTIME)
    if runtime is None or not runtime.ready:
        raise ServiceUnavailableError("not ready", STARTING_RETRY_AFTER_S)
    return runtime
