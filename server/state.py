"""What the handlers share: the settings and the runtime, under typed application keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from pipeline.backend import LipSyncBackend
from pipeline.engine import RenderEngine
from pipeline.registry import AvatarRegistry
from server.config import Settings
from server.sessions import SessionManager
from streaming.clock import Clock


@dataclass
class Runtime:
    """The long-lived parts the handlers use; built at startup, torn down at cleanup."""

    settings: Settings
    backend: LipSyncBackend
    engine: RenderEngine
    avatars: AvatarRegistry
    sessions: SessionManager
    device: dict[str, Any]
    ready: bool = False


SETTINGS = web.AppKey("settings", Settings)
RUNTIME = web.AppKey("runtime", Runtime)
CLOCK = web.AppKey("clock", Clock)


def runtime_of(request: web.Request) -> Runtime:
    """The runtime, or 503 while the server is starting or draining."""
    runtime = request.app.get(RUNTIME)
    if runtime is None or not runtime.ready:
        raise web.HTTPServiceUnavailable(reason="not ready", headers={"Retry-After": "5"})
    return runtime
