"""The aiohttp application factory, used by ``lipcast serve`` and by the tests alike."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import torch
from aiohttp import web

from pipeline.avatar import Avatar, AvatarError, discover_avatars, load_avatar
from pipeline.defaults import default_batch_sizes, default_render_budget_ms
from pipeline.engine import RenderEngine
from pipeline.engine_group import EngineGroup
from pipeline.registry import AvatarRegistry
from pipeline.runtime import (
    configure_threads,
    create_backend,
    device_report,
    measured_render_budget_ms,
    render_niceness,
    resolve_compile,
    resolve_devices,
)
from pipeline.warmup import WARMUP_TIMED_RENDERS, warm_featurizer
from server import avatar_routes, routes
from server.config import Settings
from server.errors import error_middleware
from server.metrics import Metrics
from server.runtime_metrics import RuntimeCollector
from server.sessions import SessionManager
from server.state import CLOCK, METRICS, RUNTIME, SETTINGS, Runtime
from server.virtualcam import virtualcam_ctx
from streaming.clock import Clock
from streaming.codec_warmup import warm_media_path
from streaming.rtc import observe_encoding, use_fast_audio_level, use_vp8_settings

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 20
RuntimeBuilder = Callable[[Settings, Clock | None], Runtime]
RUNTIME_BUILDER: web.AppKey[RuntimeBuilder] = web.AppKey("runtime_builder")


def avatar_search_path(settings: Settings) -> tuple[Path, ...]:
    """Where avatars are looked for: the upload directory first (avatars users prepared), then the rest."""
    dirs = settings.avatar_dirs
    if settings.upload_dir is not None and settings.upload_dir not in dirs:
        dirs = (settings.upload_dir, *dirs)
    return dirs


def load_avatars(settings: Settings) -> dict[str, Avatar]:
    found = discover_avatars(avatar_search_path(settings))
    avatars: dict[str, Avatar] = {}
    for name, root in found.items():
        try:
            avatars[name] = load_avatar(root)
        except AvatarError as e:
            logger.error("skipping avatar %s: %s", root, e)
    if settings.avatar not in avatars:
        raise AvatarError(
            f"default avatar {settings.avatar!r} not found in {[str(d) for d in settings.avatar_dirs]}"
        )
    return avatars


def build_runtime(settings: Settings, clock: Clock | None = None) -> Runtime:
    """Everything blocking at startup: devices, backends, avatars, engine warm-up (one engine per device)."""
    devices = resolve_devices(settings.device, settings.gpus)
    device = devices[0]
    report = device_report(device)
    logger.info("device: %s%s", report, f" (and {len(devices) - 1} more)" if len(devices) > 1 else "")
    # Settings left to "auto" are decided here, once the device is known; the runtime keeps the result.
    measure_budget = settings.render_budget_ms is None and device.type == "cuda"
    settings = settings.with_overrides(
        batch_sizes=settings.batch_sizes or default_batch_sizes(device),
        render_budget_ms=settings.render_budget_ms or default_render_budget_ms(settings.backend, device),
    )
    configure_threads(settings.backend, device, settings.torch_threads)
    compile_cache_dir = _compile_cache_dir(settings, device)
    avatars = load_avatars(settings)
    engines = [_device_engine(settings, d, compile_cache_dir, clock) for d in devices]
    engine: RenderEngine | EngineGroup = engines[0] if len(engines) == 1 else EngineGroup(engines)
    registry = AvatarRegistry(engine)
    for avatar in avatars.values():
        registry.add(avatar)
    timings_ms = engine.warmup(repeats=WARMUP_TIMED_RENDERS if measure_budget else 0)
    if measure_budget:
        budget_ms = measured_render_budget_ms(timings_ms, settings.max_sessions, settings.batch_sizes)
        logger.info(
            "render budget %.1f ms from warm-up timings (%d sessions at most; --render-budget-ms sets it)",
            budget_ms,
            settings.max_sessions,
        )
        settings = settings.with_overrides(render_budget_ms=budget_ms)
    report = device_report(device)  # the backend may have switched cudnn.benchmark on
    if len(devices) > 1:
        report["devices"] = [str(d) for d in devices]
    backend = engines[0].backend
    sessions = SessionManager(settings, backend, engine, registry, clock)
    return Runtime(settings, backend, engine, registry, sessions, report)


def _compile_cache_dir(settings: Settings, device: torch.device) -> Path | None:
    """Where Wav2Lip's compiled kernels come from, or None to run eager."""
    if settings.backend != "wav2lip" or not resolve_compile(settings.wav2lip_compile, device):
        return None
    from pipeline.wav2lip.compile_cache import CompileCache, default_cache_root, environment_key

    # auto: the compiled kernels when a build for this environment exists (no surprise minutes-long
    # start); on: build what is missing at start.
    root = settings.compile_cache_dir or default_cache_root()
    key = environment_key(device, torch.float16, settings.wav2lip_compile_mode)
    if settings.wav2lip_compile == "on" or CompileCache(root).has_build(key, settings.batch_sizes):
        return root
    return None


def _device_engine(
    settings: Settings, device: torch.device, compile_cache_dir: Path | None, clock: Clock | None
) -> RenderEngine:
    """The backend on one device and the engine that owns it (built with that device current)."""
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        backend = create_backend(
            settings.backend,
            device,
            checkpoint=settings.checkpoint,
            lookahead_ms=settings.lookahead_ms,
            batch_sizes=settings.batch_sizes,
            wav2lip_alignment=settings.wav2lip_alignment,
            compile_cache_dir=compile_cache_dir,
            compile_mode=settings.wav2lip_compile_mode,
        )
    return RenderEngine(
        backend,
        settings.batch_sizes,
        clock=clock.now if clock else time.monotonic,
        worker_niceness=render_niceness(device),
        device=str(device),
    )


def _warm_featurizer(runtime: Runtime) -> None:
    """A session's featurizer, made as a call makes it (a media worker unpickles the front's: its modules are
    imported now), fed a second of speech (pipeline.warmup.warm_featurizer)."""
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


def create_app(
    settings: Settings, *, clock: Clock | None = None, runtime_builder: RuntimeBuilder | None = None
) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_REQUEST_BYTES)
    app[SETTINGS] = settings
    use_fast_audio_level()  # the same audio level figure for a 20th of the CPU (every outbound packet)
    use_vp8_settings(settings.vp8())  # the callers' VP8 encoders: lipcast's settings, yuv420p taken as is
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
    avatar_routes.setup(app, routes.avatar_json)
    if settings.media_workers > 1:
        from server.front.tier import install_media_tier  # the front of several media worker processes

        install_media_tier(app)
    return app
