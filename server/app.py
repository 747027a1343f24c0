"""The server that ``lipcast serve`` runs (the tests build it the same way).

With ``media_workers`` 1 it is one process: :func:`lipcast.server.process_app.create_process_app` takes the
calls itself. With more, this process is the **front**: the same application (static pages, avatars, the
render engine) plus the media tier (:mod:`lipcast.server.front.tier`), which starts the media worker
processes (:mod:`lipcast.server.worker`) and forwards each call to one of them. ``docs/architecture.md``
draws the processes and what crosses between them.
"""

from __future__ import annotations

from aiohttp import web

from lipcast.server.config import Settings
from lipcast.server.front.tier import install_media_tier
from lipcast.server.process_app import RuntimeBuilder, create_process_app
from lipcast.streaming.clock import Clock


def create_app(
    settings: Settings, *, clock: Clock | None = None, runtime_builder: RuntimeBuilder | None = None
) -> web.Application:
    app = create_process_app(settings, clock=clock, runtime_builder=runtime_builder)
    if settings.media_workers > 1:
        install_media_tier(app)  # the front of several media worker processes
    return app
