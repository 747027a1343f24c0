"""``lipcast bench model|engine`` and ``lipcast render``: the model's speed, the engine's capacity, and
offline rendering of an audio file, with the same backend choices as the server."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from lipcast.pipeline.defaults import BACKENDS, COMPILE_MODES, DEFAULT_BACKEND, RENDER_BUDGET_MS

logger = logging.getLogger(__name__)


def batch_sizes_arg(text: str) -> tuple[int, ...]:
    """argparse type of a comma-separated list of batch sizes."""
    try:
        sizes = tuple(sorted({int(x) for x in text.split(",") if x}))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"batch sizes must be integers: {text!r}") from e
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("batch sizes must be positive")
    return sizes


def _write_json(path: Path | None, doc: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")


def _backend_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND)
    p.add_argument("--checkpoint", type=Path, help="Wav2Lip checkpoint (random weights if omitted)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--batch-sizes", type=batch_sizes_arg, help="engine batch buckets (default: per device)")


def _engine(args: argparse.Namespace, avatar_name: str | None) -> tuple[Any, Any, dict[str, Any]]:
    """Backend + engine + avatar, built as the server builds them (random weights allowed here)."""
    from lipcast.pipeline.assembly import create_backend
    from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, DEFAULT_AVATAR, discover_avatars, load_avatar
    from lipcast.pipeline.defaults import default_batch_sizes
    from lipcast.pipeline.devices import device_report, resolve_device
    from lipcast.pipeline.engine import RenderEngine

    device = resolve_device(args.device)
    sizes = args.batch_sizes or default_batch_sizes(device)
    backend = create_backend(
        args.backend, device, checkpoint=args.checkpoint, batch_sizes=sizes, random_weights=True
    )
    dirs = [*(getattr(args, "avatar_dirs", None) or []), BUILTIN_AVATAR_DIR]
    found = discover_avatars(dirs)
    name = avatar_name or DEFAULT_AVATAR
    if name not in found:
        raise SystemExit(f"unknown avatar {name!r}; available: {', '.join(sorted(found))}")
    avatar = load_avatar(found[name])
    engine = RenderEngine(backend, sizes)
    engine.add_avatar(avatar)
    return engine, avatar, device_report(device)


def bench_model(args: argparse.Namespace) -> int:
    from lipcast.pipeline.devices import device_report, resolve_device
    from lipcast.pipeline.wav2lip.bench import MODEL_BATCH_SIZES, benchmark_model

    device = resolve_device(args.device)
    cache = None
    if args.compile == "on":
        from lipcast.pipeline.wav2lip.compile_cache import CompileCache, default_cache_root

        cache = CompileCache(args.compile_cache_dir or default_cache_root())
    rows = benchmark_model(
        device,
        args.batch_sizes or MODEL_BATCH_SIZES,
        iters=args.iters,
        compile_cache=cache,
        compile_mode=args.compile_mode,
    )
    print(f"{'config':<24}{'dtype':<10}{'batch':>6}{'ms':>10}{'frames/s':>12}")
    for row in rows:
        print(
            f"{row['config']:<24}{row['dtype']:<10}{row['batch_size']:>6}"
            f"{row['latency_ms']:>10.3f}{row['frames_per_s']:>12.0f}"
        )
    _write_json(args.json, {"device": device_report(device), "rows": rows})
    return 0


def bench_engine(args: argparse.Namespace) -> int:
    from lipcast.pipeline.bench_engine import featurizer_us_per_hop, find_capacity

    engine, avatar, report = _engine(args, args.avatar)
    warm = engine.warmup()
    engine.start()
    try:
        capacity, results = find_capacity(
            engine, avatar, start=args.start, limit=args.limit, seconds=args.seconds, budget_ms=args.budget_ms
        )
    finally:
        engine.stop()
    feature_us = featurizer_us_per_hop(engine.backend)
    print(f"warm-up per batch size (ms): {', '.join(f'{k}: {v:.1f}' for k, v in warm.items())}")
    header = ("sessions", "frames", "on time", "p50 ms", "p99 ms", "max ms", "batch", "GPU MB")
    print("".join(f"{h:>9}" for h in header))
    for r in results:
        memory = "-" if r.gpu_memory_mb is None else f"{r.gpu_memory_mb:.0f}"
        print(
            f"{r.sessions:>9}{r.frames:>9}{r.on_time_share:>9.2%}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}"
            f"{r.max_ms:>9.2f}{r.mean_batch:>9.1f}{memory:>9}"
        )
    print(f"sessions with every frame on time (budget {args.budget_ms:g} ms): {capacity}")
    print(f"featurizer: {feature_us:.1f} us of CPU per 40 ms hop per session")
    _write_json(
        args.json,
        {
            "device": report,
            "warmup_ms": warm,
            "capacity_sessions": capacity,
            "budget_ms": args.budget_ms,
            "featurizer_us_per_hop": feature_us,
            "runs": [r.to_json() for r in results],
        },
    )
    return 0


def render(args: argparse.Namespace) -> int:
    from lipcast.pipeline.offline import render_file, text_progress

    engine, avatar, _ = _engine(args, args.avatar)
    engine.start()
    try:
        summary = render_file(engine, avatar, args.audio, args.output, progress=text_progress())
    except (OSError, ValueError) as e:
        print(f"lipcast render: {e}", file=sys.stderr)
        return 2
    finally:
        engine.stop()
    print(
        f"{args.output}: {summary.frames} frames ({summary.rendered} rendered), {summary.audio_s:.2f} s"
        f" of audio in {summary.wall_s:.2f} s = {summary.realtime_factor:.2f}x real time"
    )
    return 0


def add_commands(commands: Any) -> None:
    bench = commands.add_parser("bench", help="benchmarks that print figures")
    which = bench.add_subparsers(dest="bench", required=True)
    model = which.add_parser("model", help="Wav2Lip per batch size: fp32 eager vs the engine configuration")
    model.add_argument("--device", default="auto")
    model.add_argument("--batch-sizes", type=batch_sizes_arg)
    model.add_argument("--iters", type=int, default=20)
    model.add_argument("--json", type=Path)
    model.add_argument(
        "--compile", choices=("on", "off"), default="off", help="also time the compiled kernels (CUDA)"
    )
    model.add_argument(
        "--compile-mode",
        default="default",
        choices=COMPILE_MODES,
    )
    model.add_argument("--compile-cache-dir", type=Path, help="default ~/.cache/lipcast/compile")
    model.set_defaults(handler=bench_model)

    engine = which.add_parser("engine", help="how many simulated 25 fps sessions the engine keeps on time")
    _backend_arguments(engine)
    engine.add_argument("--avatar")
    engine.add_argument("--start", type=int, default=1, help="first session count tried")
    engine.add_argument("--limit", type=int, default=4096, help="largest session count tried")
    engine.add_argument("--seconds", type=float, default=4.0, help="length of each run")
    engine.add_argument("--budget-ms", type=float, default=RENDER_BUDGET_MS, help="render budget per frame")
    engine.add_argument("--json", type=Path)
    engine.set_defaults(handler=bench_engine)

    offline = commands.add_parser("render", help="render an audio file into a lip-synced MP4")
    offline.add_argument("--audio", type=Path, required=True)
    offline.add_argument("--avatar")
    offline.add_argument("--avatar-dir", action="append", dest="avatar_dirs", type=Path, default=[])
    offline.add_argument("-o", "--output", type=Path, required=True)
    _backend_arguments(offline)
    offline.set_defaults(handler=render)
