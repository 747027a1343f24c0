"""MuseTalk on the GPU (issue 29): the reference's fp16 eager step beside lipcast's engine render, the
row-only decode against a full decode, the fp16 check and the start-to-ready time. Random weights, the
spec's full-size configuration (``--tiny``: the tests' small one, for a dry run on a CPU).

    python benchmarks/musetalk_bench.py --sizes 1,8,32 --iters 20 --json OUT.json

* ``reference``: what MuseTalk's realtime_inference runs per batch, timed alone: diffusers' UNet (fp16,
  default memory format, eager) at timestep 0 on B x 8 x 32 x 32 latents with B x 50 x 384 contexts, then
  ``vae.decode`` of the whole face (whisper and the blend are not part of it; they run once per clip on
  the CPU there).
* ``engine``: :meth:`MuseTalkBackend.render` as the engine calls it: upload of the conditionings, the
  whisper encoder on each item's 30 s input, windows + PE, UNet, the row decode, resize and blend into the
  patch, download, in one CUDA graph per size (fp16, channels_last).
* ``engine_full_decode``: the same with ``decode="full"``.
* ``engine_compiled`` (``--compile-cache DIR``): the engine with the UNet and the row decode as
  ``torch.compile`` kernels (:mod:`lipcast.pipeline.musetalk.compiled`) inside its graphs; the build (or the
  load from DIR) is part of its ready time. ``--only-compiled`` skips the eager engine's row decode.
* ``rows_vs_full``: the decoded faces' rows 128..255 (what the mask can use), uint8, row decode against full.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.defaults import COMPILE_MODE, COMPILE_MODES
from lipcast.pipeline.musetalk.backend import MuseTalkBackend
from lipcast.pipeline.musetalk.compiled import musetalk_cache
from lipcast.pipeline.musetalk.config import full_configs, tiny_configs
from lipcast.pipeline.musetalk.decode import decode_full, decode_rows, plan_rows
from lipcast.pipeline.musetalk.weights import random_models
from lipcast.pipeline.wav2lip.bench import synthetic_avatar

START_S = time.perf_counter()


def timed_ms(fn: Callable[[], Any], iters: int, cuda: bool, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0 / iters


def reference_step(models: Any, size: int, device: torch.device, dtype: torch.dtype) -> Callable[[], Any]:
    latents = torch.randn(size, 8, 32, 32, device=device, dtype=dtype)
    context = torch.randn(size, 50, models.configs.context_dim, device=device, dtype=dtype)
    timestep = torch.zeros(1, dtype=torch.long, device=device)

    def step() -> Any:
        with torch.no_grad():
            predicted = models.unet(latents, timestep, encoder_hidden_states=context).sample
            return decode_full(models.vae, predicted)

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--json", default="")
    parser.add_argument("--skip-full-decode", action="store_true")
    parser.add_argument("--all-sizes", action="store_true", help="warm every default batch size (ready time)")
    parser.add_argument(
        "--compile-cache", default="", help="also the compiled engine, its kernels cached here"
    )
    parser.add_argument("--compile-mode", default=COMPILE_MODE, choices=COMPILE_MODES)
    parser.add_argument("--only-compiled", action="store_true")
    parser.add_argument("--default-format", action="store_true", help="the engine without channels_last")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.float16 if cuda else torch.float32
    configs = tiny_configs() if args.tiny else full_configs()
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else platform.processor(),
        "torch": torch.__version__,
        "config": "tiny" if args.tiny else "full",
        "sizes": sizes,
    }
    import diffusers
    import transformers

    report["diffusers"], report["transformers"] = diffusers.__version__, transformers.__version__
    print(json.dumps(report), flush=True)

    # The reference step: fp16 eager, default memory format (a fresh copy of the random weights).
    models = random_models(configs)
    models.unet.to(device, dtype)
    models.vae.to(device, dtype)
    reference: dict[int, float] = {}
    for size in sizes:
        ms = timed_ms(reference_step(models, size, device, dtype), args.iters, cuda)
        reference[size] = ms
        print(
            f"[reference fp16 eager] b{size}: {ms:.1f} ms/step, {size * 1000 / ms:.1f} frames/s", flush=True
        )
    report["reference_ms"] = reference

    # Row decode against a full decode on the same latents (uint8 faces, rows 128..255).
    with torch.no_grad():
        z = torch.randn(8, 4, 32, 32, device=device, dtype=dtype) * 0.8
        plan = plan_rows(models.vae.decoder, 120)
        full = decode_full(models.vae, z)[:, :, 128:]
        rows = decode_rows(models.vae, z, plan)[:, :, 8:]
        to_u8 = lambda x: torch.round((x.float() / 2 + 0.5).clamp(0, 1) * 255)  # noqa: E731
        diff = (to_u8(full) - to_u8(rows)).abs()
        mse = float((diff**2).mean())
        report["rows_vs_full"] = {
            "max_abs_u8": float(diff.max()),
            "mean_abs_u8": float(diff.mean()),
            "psnr_db": 10 * np.log10(255**2 / mse) if mse > 0 else float("inf"),
            "plan": list(plan.block_rows),
        }
        decode_ms = {
            "full": timed_ms(partial(decode_full, models.vae, z), args.iters, cuda),
            "rows": timed_ms(partial(decode_rows, models.vae, z, plan), args.iters, cuda),
        }
        report["decode_b8_ms"] = decode_ms
    print(f"[rows vs full] {report['rows_vs_full']} decode b8 ms {decode_ms}", flush=True)
    del models
    if cuda:
        torch.cuda.empty_cache()

    avatar = synthetic_avatar("bench", frames=16)
    variants = [] if args.only_compiled else [("engine", "rows")]
    variants += [] if args.skip_full_decode else [("engine_full_decode", "full")]
    if args.compile_cache:
        variants.append(("engine_compiled", "rows"))
    patches: dict[str, list[Any]] = {}
    for label, decode in variants:
        cache = musetalk_cache(Path(args.compile_cache)) if label == "engine_compiled" else None
        t0 = time.perf_counter()
        # every default batch size is warmed (as the server does before ready); the requested ones are timed
        backend = MuseTalkBackend(
            models=random_models(configs),
            device=device,
            batch_sizes=None if args.all_sizes else sizes,
            decode=decode,
            compile_cache=cache,
            compile_mode=args.compile_mode,
            channels_last=False if args.default_format else None,
        )
        backend.add_avatar(avatar)
        warm = backend.warmup()
        ready_s = time.perf_counter() - t0
        print(
            f"[{label}] ready (weights, avatar, fp16 check, every size warmed) in {ready_s:.1f} s; "
            f"fp16 check {backend.fp16_report}; dtype {backend.dtype}",
            flush=True,
        )
        cond = backend.speech_conditioning()
        results = {}
        for size in sizes:
            items = [RenderItem("bench", i % avatar.frame_count, cond) for i in range(size)]
            ms = timed_ms(partial(backend.render, items), args.iters, cuda)
            results[size] = ms
            print(
                f"[{label}] b{size}: {ms:.1f} ms/render, {size * 1000 / ms:.1f} frames/s "
                f"(x{reference[size] / ms:.2f} the reference step)",
                flush=True,
            )
        report[label] = {
            "ms": results,
            "ready_s": ready_s,
            "warmup_ms": warm,
            "fp16": backend.fp16_report,
            "dtype": str(backend.dtype),
        }
        if backend.compiled is not None:
            report[label]["compile_s"] = backend.compiled.compile_s
        elif cache is not None:
            report[label]["compile_s"] = "failed: eager kernels"
        check = [RenderItem("bench", i % avatar.frame_count, cond) for i in range(8)]
        patches[label] = [p.pixels.astype(np.int32) for p in backend.render(check)]
        if label in ("engine", "engine_compiled"):
            patch = backend.render([RenderItem("bench", 0, cond)])[0]
            report["patch_hw"] = list(patch.pixels.shape[:2])
            report[f"{label}_patch_sum"] = int(patch.pixels.astype(np.int64).sum())
        del backend
        if cuda:
            torch.cuda.empty_cache()
    # the rendered patches (uint8, 8 frames at batch 8) of each variant against the eager full decode's
    for label, got in patches.items():
        if label != "engine_full_decode" and "engine_full_decode" in patches:
            gaps = np.concatenate(
                [np.abs(a - b).ravel() for a, b in zip(got, patches["engine_full_decode"], strict=True)]
            )
            report[f"{label}_vs_full_decode"] = {
                "max_abs_u8": int(gaps.max()),
                "mean_abs_u8": float(gaps.mean()),
            }
            print(f"[{label} vs the eager full decode] {report[f'{label}_vs_full_decode']}", flush=True)
    report["elapsed_s"] = time.perf_counter() - START_S
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
