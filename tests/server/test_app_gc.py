"""Apps that are created, serve and are closed leave nothing alive: no process-wide registry (the encode
observers, the idle frames' planes cache) keeps an app, its runtime or its avatars."""

from __future__ import annotations

import gc
import weakref

from aiohttp import web

from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from lipcast.streaming.planes import IDLE_PLANES
from lipcast.streaming.sizes import OutputSize


async def test_closed_apps_are_freed_with_their_avatars_planes() -> None:
    before = IDLE_PLANES.avatars()
    refs = []
    for _ in range(2):
        app = create_app(Settings(port=8080))
        runner = web.AppRunner(app)
        await runner.setup()  # the runtime: avatars, engine, metrics and encode observers
        runtime = app[RUNTIME]
        avatar = runtime.avatars[runtime.settings.avatar]
        IDLE_PLANES.planes(avatar, 0, OutputSize(1280, 720))  # as a 720p call of it would
        assert IDLE_PLANES.avatars() == before + 1
        refs += [weakref.ref(app), weakref.ref(runtime), weakref.ref(avatar)]
        await runner.cleanup()
        del app, runner, runtime, avatar
        gc.collect()
        assert IDLE_PLANES.avatars() == before
    assert [r() for r in refs] == [None] * len(refs)
