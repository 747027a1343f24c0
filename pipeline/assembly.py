"""The render side of the server, assembled in one place: devices, backend, engine(s), avatars.

The server hands down one :class:`~lipcast.pipeline.render_config.RenderConfig`
(``Settings.render_config()``) and gets back a :class:`RenderSide`: the backend, the engine that owns the
devices (one engine per device, grouped), the avatar registry with every avatar prepared for that engine,
and the settings left to "auto" as decided once the device is known (batch sizes, render budget).
Nothing else builds these for the server.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lipcast.pipeline.avatar import (
    BUILTIN_AVATAR_DIR,
    DEFAULT_AVATAR,
    Avatar,
    AvatarError,
    discover_avatars,
    load_avatar,
)
from lipcast.pipeline.avatar_scene import scene_avatar
from lipcast.pipeline.backend import LipSyncBackend
from lipcast.pipeline.defaults import (
    BACKENDS,
    BUILTIN,
    COMPILE_MODE,
    MUSETALK,
    WAV2LIP,
    default_batch_sizes,
    default_render_budget_ms,
)
from lipcast.pipeline.devices import (
    configure_threads,
    device_report,
    measured_render_budget_ms,
    render_niceness,
    resolve_compile,
    resolve_devices,
)
from lipcast.pipeline.engine import RenderEngine
from lipcast.pipeline.engine_group import EngineGroup
from lipcast.pipeline.enhance.weights import Restorer
from lipcast.pipeline.registry import AvatarPreparer, AvatarRegistry
from lipcast.pipeline.render_config import RenderConfig
from lipcast.pipeline.warmup import WARMUP_TIMED_RENDERS

logger = logging.getLogger(__name__)


@dataclass
class RenderSide:
    backend: LipSyncBackend
    engine: RenderEngine | EngineGroup
    registry: AvatarRegistry
    device_report: dict[str, Any]
    batch_sizes: tuple[int, ...]  # as resolved for the device
    render_budget_ms: float  # as resolved (measured on CUDA unless given)


def load_avatars(
    avatar_dirs: tuple[Path, ...], default_avatar: str, hd_sizes: tuple[tuple[int, int], ...] = ()
) -> dict[str, Avatar]:
    """Every avatar found in ``avatar_dirs`` (one that fails to load is logged and skipped), and the built-in
    one at each of ``hd_sizes`` (:mod:`lipcast.pipeline.avatar_scene`); the default must be among them."""
    found = discover_avatars(avatar_dirs)
    avatars: dict[str, Avatar] = {}
    for name, root in found.items():
        try:
            avatars[name] = load_avatar(root)
        except AvatarError as e:
            logger.error("skipping avatar %s: %s", root, e)
    builtin = avatars.get(DEFAULT_AVATAR)
    if builtin is not None and builtin.root is not None and builtin.root.parent == BUILTIN_AVATAR_DIR:
        for width, height in hd_sizes:
            scene = scene_avatar(builtin, width, height)
            avatars.setdefault(scene.name, scene)  # a user's avatar of that name wins
    if default_avatar not in avatars:
        raise AvatarError(f"default avatar {default_avatar!r} not found in {[str(d) for d in avatar_dirs]}")
    return avatars


def avatar_registry(renderer: AvatarPreparer, avatars: dict[str, Avatar]) -> AvatarRegistry:
    """``avatars`` registered with ``renderer``, which prepares each before its name is listed."""
    registry = AvatarRegistry(renderer)
    for avatar in avatars.values():
        registry.add(avatar)
    return registry


def assemble(config: RenderConfig, clock: Callable[[], float] | None = None) -> RenderSide:
    """Everything blocking at startup: devices, backends, avatars, engine warm-up (one engine per device).

    ``clock``: the media clock the engine's deadlines are on (``time.monotonic`` if None)."""
    devices = resolve_devices(config.device, config.gpus)
    device = devices[0]
    report = device_report(device)
    logger.info("device: %s%s", report, f" (and {len(devices) - 1} more)" if len(devices) > 1 else "")
    # Settings left to "auto" are decided here, once the device is known; the caller keeps the result.
    measure_budget = config.render_budget_ms is None and device.type == "cuda"
    batch_sizes = config.batch_sizes or default_batch_sizes(device, config.backend)
    budget_ms = config.render_budget_ms or default_render_budget_ms(config.backend, device)
    configure_threads(config.backend, device, config.torch_threads)
    compile_cache_dir = _compile_cache_dir(config, device, batch_sizes)
    avatars = load_avatars(config.avatar_dirs, config.default_avatar, config.builtin_hd_sizes)
    restorer = load_face_restorer(config)
    engines = [_device_engine(config, d, batch_sizes, compile_cache_dir, clock, restorer) for d in devices]
    engine: RenderEngine | EngineGroup = engines[0] if len(engines) == 1 else EngineGroup(engines)
    registry = avatar_registry(engine, avatars)
    timings_ms = engine.warmup(repeats=WARMUP_TIMED_RENDERS if measure_budget else 0)
    if measure_budget:
        budget_ms = measured_render_budget_ms(timings_ms, config.max_sessions, batch_sizes)
        logger.info(
            "render budget %.1f ms from warm-up timings (%d sessions at most; --render-budget-ms sets it)",
            budget_ms,
            config.max_sessions,
        )
    report = device_report(device)  # the backend may have switched cudnn.benchmark on
    if len(devices) > 1:
        report["devices"] = [str(d) for d in devices]
    return RenderSide(engines[0].backend, engine, registry, report, batch_sizes, budget_ms)


def load_face_restorer(config: RenderConfig) -> Restorer | None:
    """The sharpen stage's restorer (:mod:`lipcast.pipeline.enhance.weights`), checked, or None when no
    weights file is configured; a file that cannot be used raises ``EnhanceWeightsError`` (path, reason)."""
    if config.face_enhance_weights is None:
        return None
    from lipcast.pipeline.enhance.weights import load_restorer

    restorer = load_restorer(config.face_enhance_weights)
    logger.info("face enhance: %s", restorer.describe())
    return restorer


def _compile_cache_dir(
    config: RenderConfig, device: torch.device, batch_sizes: tuple[int, ...]
) -> Path | None:
    """Where Wav2Lip's or MuseTalk's compiled kernels come from, or None to run eager."""
    if config.backend == WAV2LIP:
        choice, mode = config.wav2lip_compile, config.wav2lip_compile_mode
    elif config.backend == MUSETALK:
        choice, mode = config.musetalk_compile, COMPILE_MODE
    else:
        return None
    if not resolve_compile(choice, device):
        return None
    from lipcast.pipeline.musetalk.compiled import musetalk_cache
    from lipcast.pipeline.wav2lip.compile_cache import (
        MUSETALK_BUILD_HINT,
        WAV2LIP_BUILD_HINT,
        CompileCache,
        default_cache_root,
        environment_key,
    )

    # auto: the compiled kernels when a build for this environment exists (no surprise minutes-long
    # start); on: build what is missing at start.
    root = config.compile_cache_dir or default_cache_root()
    cache = musetalk_cache(root) if config.backend == MUSETALK else CompileCache(root)
    key = environment_key(device, torch.float16, mode)
    hint = MUSETALK_BUILD_HINT if config.backend == MUSETALK else WAV2LIP_BUILD_HINT
    if choice == "on" or cache.has_build(key, batch_sizes, hint):
        return root
    return None


def _device_engine(
    config: RenderConfig,
    device: torch.device,
    batch_sizes: tuple[int, ...],
    compile_cache_dir: Path | None,
    clock: Callable[[], float] | None,
    restorer: Restorer | None = None,
) -> RenderEngine:
    """The backend on one device and the engine that owns it (built with that device current)."""
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        backend = create_backend(
            config.backend,
            device,
            checkpoint=config.checkpoint,
            lookahead_ms=config.lookahead_ms,
            batch_sizes=batch_sizes,
            wav2lip_alignment=config.wav2lip_alignment,
            compile_cache_dir=compile_cache_dir,
            compile_mode=config.wav2lip_compile_mode,
            render_config=config,
            restorer=restorer,
        )
    return RenderEngine(
        backend,
        batch_sizes,
        clock=clock or time.monotonic,
        worker_niceness=render_niceness(device),
        device=str(device),
    )


def create_backend(
    name: str,
    device: torch.device,
    *,
    checkpoint: Path | None = None,
    lookahead_ms: float | None = None,
    batch_sizes: Sequence[int] = (),
    wav2lip_alignment: str = "inference",
    random_weights: bool = False,
    compile_cache_dir: Path | None = None,
    compile_mode: str | None = None,
    render_config: RenderConfig | None = None,
    restorer: Restorer | None = None,
) -> LipSyncBackend:
    """Build the named backend on ``device`` (``batch_sizes``: the engine's, for per-size preparation).

    Wav2Lip needs a ``checkpoint`` unless ``random_weights`` (benchmarks and tests only);
    ``compile_cache_dir``: Wav2Lip compiles its kernels, cached there (see :func:`resolve_compile`).
    MuseTalk takes its settings (weights directory, context, floor, decode) from ``render_config``.
    ``restorer``: the sharpen stage's network (Wav2Lip only)."""
    if restorer is not None and name != WAV2LIP:
        raise ValueError(f"face enhancement works with the {WAV2LIP} backend only, not {name}")
    if name == BUILTIN:
        from lipcast.pipeline.builtin import BuiltinBackend

        kwargs: dict[str, Any] = {} if lookahead_ms is None else {"lookahead_ms": lookahead_ms}
        return BuiltinBackend(device, **kwargs)
    if name == WAV2LIP:
        from lipcast.pipeline.wav2lip.backend import Wav2LipBackend

        if checkpoint is None and not random_weights:
            raise ValueError("the wav2lip backend needs a checkpoint file")
        from lipcast.pipeline.wav2lip.featurizer import INFERENCE_ALIGNMENT, TRAINING_ALIGNMENT

        offset = TRAINING_ALIGNMENT if wav2lip_alignment == "training" else INFERENCE_ALIGNMENT
        from lipcast.pipeline.wav2lip.compile_cache import CompileCache

        sizes = tuple(batch_sizes) or None  # None: the device's default
        cache = None if compile_cache_dir is None else CompileCache(compile_cache_dir)
        return Wav2LipBackend(
            checkpoint,
            device=device,
            batch_sizes=sizes,
            window_offset_frames=offset,
            compile_cache=cache,
            compile_mode=compile_mode or COMPILE_MODE,
            restorer=restorer,
        )
    if name == MUSETALK:
        from lipcast.pipeline.musetalk.backend import MuseTalkBackend
        from lipcast.pipeline.musetalk.compiled import musetalk_cache

        rc = render_config or RenderConfig(backend=MUSETALK)
        return MuseTalkBackend(
            rc.musetalk_weights,
            device=device,
            batch_sizes=tuple(batch_sizes) or None,
            context_s=rc.musetalk_context_s,
            lookahead_ms=lookahead_ms,
            floor=rc.musetalk_floor,
            decode=rc.musetalk_decode,
            compile_cache=None if compile_cache_dir is None else musetalk_cache(compile_cache_dir),
        )
    raise ValueError(f"unknown backend {name!r} (one of {', '.join(BACKENDS)})")
