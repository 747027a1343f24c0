"""The aiohttp application of one process that takes calls: the only process, the front, or a media worker.

Its handlers (:mod:`lipcast.server.routes`), the runtime's start-up and tear-down, and its metrics. How the
runtime is built is the caller's choice (``runtime_builder``; :func:`lipcast.server.assembly.build_runtime`
by default, a media worker passes its own); :func:`lipcast.server.app.create_app` adds the media tier on
the front when there are media workers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from lipcast.pipeline.warmup import warm_featurizer
from lipcast.server import avatar_routes, routes
from lipcast.server.assembly import build_runtime
from lipcast.server.config import Settings
from lipcast.server.errors import error_middleware
from lipcast.server.metrics import Metrics
from lipcast.server.runtime_metrics import RuntimeCollector
from lipcast.server.state import CLOCK, METRICS, RUNTIME, SETTINGS, Runtime
from lipcast.server.virtualcam import virtualcam_ctx
from lipcast.streaming.clock import Clock
from lipcast.streaming.codec_warmup import warm_media_path
from lipcast.streaming.interop import use_interop
from lipcast.streaming.rtc import (
    observe_encoding,
    use_congestion_control,
    use_fast_audio_level,
    use_h264_settings,
    use_opus_fec,
    use_vp8_settings,
)

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 20
RuntimeBuilder = Callable[[Settings, Clock | None], Runtime]
RUNTIME_BUILDER: web.AppKey[RuntimeBuilder] = web.AppKey("runtime_builder")


def _warm_featurizer(runtime: Runtime) -> None:
    """A session's featurizer, made as a call makes it (a media worker unpickles the front's: its modules are
    imported now), fed a second of speech (lipcast.pipeline.warmup.warm_featurizer)."""
    start = time.perf_counter()
    frames = warm_featurizer(runtime.backend.new_featurizer())
    logger.info("featurizer warmed (%d frames) in %.0f ms", frames, (time.perf_counter() - start) * 1000)


async def _runtime_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    clock = app.get(CLOCK)
    loop = asyncio.get_running_loop()
    builder = app.get(RUNTIME_BUILDER, build_runtime)  # a media worker builds its own (server/worker)
    runtime = await loop.run_in_executor(None, builder, settings, clock)
    if settings.media_workers <= 1:  # this process takes calls itself (a media worker, or the only process)
        avatar = runtime.avatars[settings.avatar]
        await loop.run_in_executor(None, warm_media_path, avatar.width, avatar.height, settings.vp8())
        await loop.run_in_executor(None, _warm_featurizer, runtime)
    runtime.engine.start()
    metrics = app[METRICS]
    metrics.attach(RuntimeCollector(runtime))
    runtime.sessions.frame_observer = metrics.observe_frame
    stop_observing = observe_encoding(metrics.observe_encode)
    runtime.ready = True
    app[RUNTIME] = runtime
    logger.info(
        "ready: backend %s, %d avatar(s), warm-up %.2f s",
        settings.backend,
        len(runtime.avatars),
        runtime.engine.warmup_s or 0.0,
    )
    try:
        yield
    finally:
        runtime.ready = False
        stop_observing()
        await runtime.sessions.close_all()
        await loop.run_in_executor(None, runtime.engine.stop)


async def _close_sessions(app: web.Application) -> None:
    runtime = app.get(RUNTIME)
    if runtime is not None:
        runtime.ready = False
        await runtime.sessions.close_all()


def create_process_app(
    settings: Settings, *, clock: Clock | None = None, runtime_builder: RuntimeBuilder | None = None
) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_REQUEST_BYTES)
    app[SETTINGS] = settings
    use_fast_audio_level()  # the same audio level figure for a 20th of the CPU (every outbound packet)
    use_opus_fec()  # in-band FEC both ways: asked of callers in the answer, sent to them
    use_congestion_control()  # loss-based video bitrate, a retransmission budget
    use_interop()  # DTLS and ICE as OBS, GStreamer and browsers expect (lipcast.streaming.interop)
    use_vp8_settings(settings.vp8())  # the callers' VP8 encoders: lipcast's settings, yuv420p taken as is
    use_h264_settings(settings.h264())  # and H.264: constrained baseline, the level for the size, realtime
    if runtime_builder is not None:
        app[RUNTIME_BUILDER] = runtime_builder
    app[METRICS] = Metrics()
    if clock is not None:
        app[CLOCK] = clock
    app.cleanup_ctx.append(_runtime_ctx)
    if settings.virtualcam:
        app.cleanup_ctx.append(virtualcam_ctx)  # after the runtime: it follows the runtime's sessions
    app.on_shutdown.append(_close_sessions)
    routes.setup(app)
    avatar_routes.setup(app)
    return app
