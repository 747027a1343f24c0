"""``lipcast engine build``: compile Wav2Lip's kernels for every batch bucket once, into the compile cache
that later ``lipcast serve`` starts load (see :mod:`lipcast.pipeline.wav2lip.compiled`).

It builds what a start would build (same model code, buckets, dtype and memory format), one bucket after
the other with a progress line each, then checks the compiled render against the eager fp32 model and
writes the cache manifest. Exit status: 0 built (or nothing to build: a CPU host renders eager), 1 the
numerical check failed, 2 it could not build (no Triton on a CUDA host, a bad checkpoint).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from lipcast.pipeline.defaults import COMPILE_MODES
from lipcast.server.tools_cli import batch_sizes_arg

logger = logging.getLogger(__name__)

# Compiled fp16 against eager fp32, in uint8 levels of the pasted patches: fp16 storage between 50 layers
# moves the (0, 1) output by up to ~1e-2 where the sigmoid is steep (the eager fp16 graphs already differ
# this much: tests/pipeline/test_wav2lip_backend.py allows the same), and rounding to uint8 adds one level.
# A wrong kernel (a swapped skip, a bad layout) moves whole regions by tens of levels.
MAX_LEVEL_DIFF = 8
MAX_MEAN_LEVEL_DIFF = 0.5
CHECK_ITEMS = 8


def numerical_check(compiled: Any, reference: Any, avatar_name: str, frames: int) -> dict[str, float]:
    """Render the same items on both backends; max and mean |difference| in uint8 levels."""
    import numpy as np

    from lipcast.pipeline.backend import RenderItem
    from lipcast.pipeline.wav2lip.featurizer import CONDITIONING_SHAPE

    rng = np.random.default_rng(0)
    size = min(compiled.batch_sizes, key=lambda s: (s < CHECK_ITEMS, abs(s - CHECK_ITEMS)))
    items = [
        RenderItem(avatar_name, i % frames, rng.uniform(-4, 4, CONDITIONING_SHAPE).astype(np.float32))
        for i in range(size)
    ]
    got, want = compiled.render(items), reference.render(items)
    diffs = [np.abs(g.pixels.astype(np.int16) - w.pixels) for g, w in zip(got, want, strict=True)]
    return {
        "batch_size": size,
        "max_level_diff": float(max(int(d.max()) for d in diffs)),
        "mean_level_diff": float(np.mean([d.mean() for d in diffs])),
    }


def build(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from lipcast.pipeline.backend import RenderItem
    from lipcast.pipeline.defaults import default_batch_sizes
    from lipcast.pipeline.devices import resolve_device
    from lipcast.pipeline.wav2lip.backend import Wav2LipBackend
    from lipcast.pipeline.wav2lip.bench import synthetic_avatar
    from lipcast.pipeline.wav2lip.checkpoint import CheckpointError
    from lipcast.pipeline.wav2lip.compile_cache import CompileCache, default_cache_root
    from lipcast.pipeline.wav2lip.compiled import compile_available
    from lipcast.pipeline.wav2lip.featurizer import CONDITIONING_SHAPE

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        device = resolve_device(args.device)
    except RuntimeError as e:
        print(f"lipcast engine build: {e}", file=sys.stderr)
        return 2
    if device.type != "cuda":
        print(
            f"lipcast engine build: nothing to build on {device}: compiled kernels are for CUDA; the CPU"
            " path renders with eager kernels"
        )
        return 0
    if not compile_available(device):
        print(
            "lipcast engine build: torch.compile needs Triton on this CUDA host; not installed",
            file=sys.stderr,
        )
        return 2
    sizes = args.batch_sizes or default_batch_sizes(device)
    cache = CompileCache(args.compile_cache_dir or default_cache_root())
    started_s = time.perf_counter()
    weights: Any = args.checkpoint
    if weights is None:  # random weights, the same for the build and its check
        from lipcast.pipeline.wav2lip.model import Wav2Lip

        torch.manual_seed(0)
        weights = Wav2Lip().state_dict()
    try:
        backend = Wav2LipBackend(
            weights,
            device=device,
            batch_sizes=sizes,
            compile_cache=cache,
            compile_mode=args.compile_mode,
        )
    except (OSError, CheckpointError) as e:
        print(f"lipcast engine build: {e}", file=sys.stderr)
        return 2
    avatar = synthetic_avatar(frames=4)
    backend.add_avatar(avatar)
    silence = np.full(CONDITIONING_SHAPE, -4.0, dtype=np.float32)
    per_size_s: dict[int, float] = {}
    for n, size in enumerate(sizes, 1):
        t0 = time.perf_counter()
        backend.render([RenderItem(avatar.name, i % avatar.frame_count, silence) for i in range(size)])
        per_size_s[size] = time.perf_counter() - t0
        print(f"engine build: batch {size} ({n}/{len(sizes)}) ready in {per_size_s[size]:.1f} s", flush=True)
    total_s = time.perf_counter() - started_s
    if backend.compiled is None:
        print("lipcast engine build: torch.compile failed (see the log above)", file=sys.stderr)
        return 2
    reference = Wav2LipBackend(
        weights, device=device, dtype=torch.float32, batch_sizes=sizes, cuda_graphs=False
    )
    reference.add_avatar(avatar)
    check = numerical_check(backend, reference, avatar.name, avatar.frame_count)
    ok = check["max_level_diff"] <= MAX_LEVEL_DIFF and check["mean_level_diff"] <= MAX_MEAN_LEVEL_DIFF
    print(
        f"engine build: {len(sizes)} batch sizes ({backend.dtype}) in {total_s:.1f} s into"
        f" {backend.compiled.status.directory}; compiled vs eager fp32 at batch {check['batch_size']}:"
        f" max {check['max_level_diff']:.0f} levels, mean {check['mean_level_diff']:.3f}"
        f" ({'ok' if ok else 'TOO FAR'}: limits {MAX_LEVEL_DIFF}, {MAX_MEAN_LEVEL_DIFF})"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "device": torch.cuda.get_device_name(device),
            "cache_dir": str(backend.compiled.status.directory),
            "dtype": str(backend.dtype),
            "build_s": total_s,
            "per_size_s": per_size_s,
            "cached_before": list(backend.compiled.status.built_sizes),
            "check": check,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if ok else 1


def add_commands(commands: Any) -> None:
    engine = commands.add_parser("engine", help="the render engine's compiled kernels")
    which = engine.add_subparsers(dest="engine", required=True)
    p = which.add_parser(
        "build", help="compile Wav2Lip's kernels for every batch size into the compile cache"
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        help="Wav2Lip checkpoint (random weights if omitted: the kernels"
        " take the weights as inputs, so one build serves every checkpoint)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--batch-sizes", type=batch_sizes_arg, help="engine batch buckets (default: per device)")
    p.add_argument("--compile-cache-dir", type=Path, help="default ~/.cache/lipcast/compile")
    p.add_argument(
        "--compile-mode", choices=COMPILE_MODES, default=COMPILE_MODES[0], help="torch.compile mode"
    )
    p.add_argument("--json", type=Path, help="write the build times and the check here")
    p.set_defaults(handler=build)
