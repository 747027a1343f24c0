"""MuseTalk's network kernels at one batch size on the GPU: what each lever buys (issue 29's target).

    python benchmarks/musetalk_kernels.py --size 32 --json OUT.json [--budget-s 300]

Random weights of the published configuration, fp16. Every variant is timed as the engine runs it, inside a
CUDA graph (captured after warm-up), the mean of ``--iters`` replays:

* ``reference``: diffusers' UNet + ``vae.decode`` (whole face), eager, default memory format (no graph: as
  MuseTalk's realtime script runs it);
* the UNet, the whole-face decode and the row decode (:mod:`lipcast.pipeline.musetalk.decode`), eager or
  ``torch.compile``d (mode ``default``: Inductor fuses GroupNorm + SiLU and the residual adds around cuDNN's
  convolutions; ``max-autotune-no-cudagraphs`` also autotunes them), channels_last or not;
* the whisper encoder on the 30 s input;
* the row decode with the mid block's attention left out (its measured effect on the face);
* correctness: each compiled decode against the eager whole-face decode, uint8, face rows 128..255.

Variants run in order until ``--budget-s`` is spent (compiles take minutes); the rest are reported skipped.
"""

# ruff: noqa: B023  (every closure runs within its loop iteration)
from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from musetalk_bench import timed_ms  # this folder (run as a script)

from lipcast.pipeline.musetalk.config import full_configs
from lipcast.pipeline.musetalk.decode import decode_full, decode_rows, plan_rows
from lipcast.pipeline.musetalk.weights import random_models

START_S = time.perf_counter()


def graphed_ms(fn: Callable[[], Any], iters: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0 / iters


def to_u8(x: torch.Tensor) -> torch.Tensor:
    return torch.round((x.float() / 2 + 0.5).clamp(0, 1) * 255)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--json", default="")
    parser.add_argument("--autotune", action="store_true", help="also max-autotune-no-cudagraphs (decoder)")
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/musetalk-kernels-cache")
    torch.backends.cudnn.benchmark = True
    device, dtype, size = torch.device("cuda"), torch.float16, args.size
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "size": size,
    }
    results: dict[str, Any] = {}
    report["results"] = results

    def record(name: str, value: Any) -> None:
        results[name] = value
        print(f"[{time.perf_counter() - START_S:6.1f} s] {name}: {value}", flush=True)

    models = random_models(full_configs())
    unet, vae, whisper = models.unet, models.vae, models.whisper
    unet.to(device, dtype)
    vae.to(device, dtype)
    whisper.to(device, dtype)
    report["attention"] = sorted({type(p).__name__ for p in unet.attn_processors.values()})
    report["vae_attention"] = sorted({type(p).__name__ for p in vae.attn_processors.values()})
    print(json.dumps(report), flush=True)
    torch.manual_seed(0)
    latents = torch.randn(size, 8, 32, 32, device=device, dtype=dtype) * 0.8
    context = torch.randn(size, 50, 384, device=device, dtype=dtype)
    timestep = torch.zeros(size, dtype=torch.long, device=device)
    z = torch.randn(size, 4, 32, 32, device=device, dtype=dtype) * 0.8
    mel = torch.randn(size, 80, 3000, device=device, dtype=dtype)
    plan = plan_rows(vae.decoder, 120)

    def unet_fn(x: torch.Tensor = latents) -> torch.Tensor:
        return unet(x, timestep, encoder_hidden_states=context).sample

    with torch.no_grad():
        record("reference_ms", timed_ms(lambda: decode_full(vae, unet_fn()), args.iters, cuda=True))
        full_u8 = to_u8(decode_full(vae, z)[:, :, 128:])
        record("whisper_graph_ms", graphed_ms(lambda: whisper(mel, output_hidden_states=True), args.iters))

        def compare(name: str, faces: torch.Tensor) -> None:
            diff = (to_u8(faces) - full_u8).abs()
            record(name, {"max_abs_u8": float(diff.max()), "mean_abs_u8": float(diff.mean())})

        for fmt_name, fmt in (("default", torch.contiguous_format), ("cl", torch.channels_last)):
            unet.to(memory_format=fmt)
            vae.to(memory_format=fmt)
            lat, zz = latents.contiguous(memory_format=fmt), z.contiguous(memory_format=fmt)
            record(f"unet_eager_{fmt_name}_graph_ms", graphed_ms(lambda: unet_fn(lat), args.iters))
            record(
                f"decode_full_eager_{fmt_name}_graph_ms", graphed_ms(lambda: decode_full(vae, zz), args.iters)
            )
            record(
                f"decode_rows_eager_{fmt_name}_graph_ms",
                graphed_ms(lambda: decode_rows(vae, zz, plan), args.iters),
            )
            del lat
        compare("rows_eager_vs_full", decode_rows(vae, z, plan)[:, :, 8:])

        # the mid block's attention left out (channels_last)
        attentions = vae.decoder.mid_block.attentions
        vae.decoder.mid_block.attentions = torch.nn.ModuleList([torch.nn.Identity() for _ in attentions])
        zz = z.contiguous(memory_format=torch.channels_last)
        record(
            "decode_rows_noattn_eager_cl_graph_ms", graphed_ms(lambda: decode_rows(vae, zz, plan), args.iters)
        )
        compare("rows_noattn_vs_full", decode_rows(vae, z, plan)[:, :, 8:])
        vae.decoder.mid_block.attentions = attentions

    variants: list[tuple[str, str, torch.memory_format, bool]] = [
        ("decode_rows", "default", torch.channels_last, False),
        ("unet", "default", torch.channels_last, False),
        ("decode_rows", "default", torch.contiguous_format, False),
        ("decode_rows_dynamic", "default", torch.channels_last, True),
        ("unet", "default", torch.contiguous_format, False),
    ]
    if args.autotune:
        variants.append(("decode_rows", "max-autotune-no-cudagraphs", torch.channels_last, False))
    for what, mode, fmt, dynamic in variants:
        fmt_name = "cl" if fmt == torch.channels_last else "default"
        name = f"{what}_compiled_{mode}_{fmt_name}"
        if time.perf_counter() - START_S > args.budget_s:
            record(name, "skipped (budget)")
            continue
        torch._dynamo.reset()
        unet.to(memory_format=fmt)
        vae.to(memory_format=fmt)
        lat, zz = latents.contiguous(memory_format=fmt), z.contiguous(memory_format=fmt)
        try:
            with torch.no_grad():
                if what == "unet":
                    fn = torch.compile(
                        lambda: unet(lat, timestep, encoder_hidden_states=context).sample,
                        mode=mode,
                        dynamic=False,
                    )
                    t0 = time.perf_counter()
                    fn()
                    torch.cuda.synchronize()
                    record(name + "_build_s", time.perf_counter() - t0)
                    record(name + "_graph_ms", graphed_ms(fn, args.iters))
                else:
                    dec = torch.compile(
                        lambda x: decode_rows(vae, x, plan), mode=mode, dynamic=True if dynamic else False
                    )
                    t0 = time.perf_counter()
                    out = dec(zz)
                    torch.cuda.synchronize()
                    record(name + "_build_s", time.perf_counter() - t0)
                    compare(name + "_vs_full", out[:, :, 8:])
                    record(name + "_graph_ms", graphed_ms(lambda: dec(zz), args.iters))
                    if dynamic:
                        for other in (8, 16, 64):
                            t0 = time.perf_counter()
                            small = zz[:other].contiguous(memory_format=fmt) if other <= size else None
                            if small is None:
                                small = torch.cat([zz, zz])[:other].contiguous(memory_format=fmt)
                            dec(small)
                            torch.cuda.synchronize()
                            record(f"{name}_b{other}_first_s", time.perf_counter() - t0)
                            record(f"{name}_b{other}_graph_ms", graphed_ms(partial(dec, small), args.iters))
        except Exception as e:  # report and go on with the next variant
            record(name, f"failed: {type(e).__name__}: {str(e)[:300]}")
    report["elapsed_s"] = time.perf_counter() - START_S
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
