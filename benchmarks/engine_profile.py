"""Where a Wav2Lip engine render's time goes on CUDA, and what compiled kernels change (issue 12).

    python benchmarks/engine_profile.py --sizes 1,128 [--modes default,max-autotune-no-cudagraphs] --out DIR

Per batch size, with random weights and the model bench's synthetic avatar (256x256 face box):

* ``render``: :meth:`Wav2LipBackend.render` as the engine calls it (host prep, upload, graph, download,
  patch views), mean ms over ``--iters``; and its pieces timed with CUDA events on the backend's stream:
  replay (the upload from a pinned buffer, gather, network, paste: one graph), download;
* the network alone (audio encoder + decoder on the gathered features, fp16 channels_last) captured in a
  CUDA graph; the host's steps of a render (table rows, launch, wait) in microseconds;
* each of: eager fp32 of the whole face (the reference), the fp16 graphs with fused conv units
  (:mod:`lipcast.pipeline.wav2lip.fused`) decoding the whole face, and the same decoding only the rows the paste
  reads (:mod:`lipcast.pipeline.wav2lip.rows`, the default), all with the same random weights; every variant's
  patches against the fp32 reference's (uint8 |difference|, max and mean);
* the top CUDA kernels of the largest size's render (torch.profiler) of both fp16 variants, to
  ``DIR/kernels_<variant>.txt``;
* per ``--modes`` (torch.compile modes, none by default), on the rows, without and with fused units, the
  first build from an empty cache and the whole render with that mode's kernels inside the backend's graphs.

Everything goes to stdout and ``DIR/engine_profile.json``. Stops starting new work after ``--deadline-s``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lipcast.pipeline.wav2lip.backend import Wav2LipBackend
from lipcast.pipeline.wav2lip.bench import random_items, synthetic_avatar
from lipcast.pipeline.wav2lip.compile_cache import CompileCache
from lipcast.pipeline.wav2lip.featurizer import CONDITIONING_SHAPE
from lipcast.pipeline.wav2lip.model import Wav2Lip
from lipcast.pipeline.wav2lip.rows import decode_rows
from lipcast.pipeline.wav2lip.tables import batch_rows

START_S = time.perf_counter()


def elapsed_s() -> float:
    return time.perf_counter() - START_S


def mean_ms(fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0 / iters


def render_pieces(backend: Wav2LipBackend, size: int, iters: int) -> dict[str, float]:
    """CUDA-event times of one bucket's replay (the upload is its first node) and download (the steps of
    ``_launch_graph``), and the host time of the replay call."""
    bucket = backend._buckets[size]
    stream = backend._stream
    assert stream is not None
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    totals = np.zeros(3)
    out_host = torch.empty(bucket.out.shape, dtype=torch.uint8, pin_memory=True)
    for _ in range(iters):
        with torch.cuda.stream(stream):
            marks[0].record(stream)
            t0 = time.perf_counter()
            bucket.graph.replay()
            call_s = time.perf_counter() - t0
            marks[1].record(stream)
            out_host.copy_(bucket.out, non_blocking=True)
            marks[2].record(stream)
        stream.synchronize()
        totals += [*(marks[i].elapsed_time(marks[i + 1]) for i in range(2)), call_s * 1e3]
    replay, download, call = totals / iters
    return {"replay_ms": replay, "download_ms": download, "replay_call_us": call * 1e3}


def network_graph_ms(fn: Callable[[], torch.Tensor], iters: int) -> float:
    """Mean ms of ``fn`` captured in a CUDA graph (launch overhead out, as in the engine)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    return mean_ms(graph.replay, iters)


def patch_error(reference: Wav2LipBackend, engine: Wav2LipBackend, items: list[Any]) -> dict[str, float]:
    """uint8 |difference| of ``engine``'s patches from the fp32 reference's, max and mean."""
    ref = np.stack([p.pixels for p in reference.render(items)]).astype(np.int16)
    out = np.stack([p.pixels for p in engine.render(items)]).astype(np.int16)
    diff = np.abs(ref - out)
    return {"vs_fp32_max": float(diff.max()), "vs_fp32_mean": float(diff.mean())}


def network(backend: Wav2LipBackend, mel: torch.Tensor, feats: Sequence[torch.Tensor]) -> torch.Tensor:
    return decode_rows(backend.model, backend.model.encode_audio(mel), feats, backend.row_plan)


def network_inputs(backend: Wav2LipBackend, size: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    fmt, dtype = backend.memory_format, backend.dtype
    mel = torch.randn(size, 1, *CONDITIONING_SHAPE, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    rows = torch.arange(size, device="cuda") % backend._feats[0].shape[0]
    feats = [t.index_select(0, rows).contiguous(memory_format=fmt) for t in backend._feats]
    return mel, feats


def host_pieces(backend: Wav2LipBackend, items: list[Any], iters: int) -> dict[str, float]:
    """Host microseconds of a graph render's steps: the table rows, the launch (mel stack, uploads, replay,
    download queued) and the wait for the stream, with no patch building in between."""
    totals = np.zeros(3)
    for _ in range(iters):
        t0 = time.perf_counter()
        rows, _entries = batch_rows(backend._avatars, items)
        t1 = time.perf_counter()
        _canvases, finish = backend._launch_graph(rows, items)
        t2 = time.perf_counter()
        finish()
        totals += [t1 - t0, t2 - t1, time.perf_counter() - t2]
    rows_us, launch_us, wait_us = totals * 1e6 / iters
    return {"host_rows_us": rows_us, "host_launch_us": launch_us, "host_wait_us": wait_us}


def profile_kernels(backend: Wav2LipBackend, items: list[Any], path: Path) -> str:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        backend.render(items)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            backend.render(items)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=170)
    path.write_text(table)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,128")
    parser.add_argument("--modes", default="")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--deadline-s", type=float, default=480.0)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "engine_profile")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    modes = [m for m in args.modes.split(",") if m]
    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sizes": {}}
    rng = np.random.default_rng(0)
    avatar = synthetic_avatar()

    torch.manual_seed(0)
    weights = {"state_dict": Wav2Lip().state_dict()}  # one set of random weights for every variant
    # eager fp32 of the whole face: the reference (and last round's baseline); then the fp16 fused graphs
    # of the whole face (last round's default) and of the rows the paste reads (the default now)
    configs: dict[str, dict[str, Any]] = {
        "eager_fp32": {"dtype": torch.float32, "fuse_units": False, "crop_rows": False},
        "fused_whole_face": {"crop_rows": False},
        "fused_rows": {},
    }
    engines = {}
    for label, kwargs in configs.items():
        engines[label] = Wav2LipBackend(weights, device="cuda", batch_sizes=sizes, **kwargs)
        engines[label].add_avatar(avatar)
    reference = engines["eager_fp32"]
    for size in sizes:
        items = random_items(avatar, size, rng)
        for label, engine in engines.items():
            row: dict[str, Any] = {"render_ms": mean_ms(partial(engine.render, items), args.iters)}
            row.update(render_pieces(engine, size, args.iters))
            row.update(host_pieces(engine, items, args.iters))
            mel, feats = network_inputs(engine, size)
            row["network_graph_ms"] = network_graph_ms(partial(network, engine, mel, feats), args.iters)
            row["render_frames_per_s"] = size * 1000.0 / row["render_ms"]
            row.update(patch_error(reference, engine, items))
            doc["sizes"].setdefault(size, {})[label] = row
            print(
                f"[{elapsed_s():5.0f} s] {label} batch {size}: "
                + ", ".join(f"{k} {v:.3f}" for k, v in row.items()),
                flush=True,
            )
    (args.out / "engine_profile.json").write_text(json.dumps(doc, indent=1))
    top = max(sizes)
    for label in ("fused_whole_face", "fused_rows"):
        table = profile_kernels(
            engines[label], random_items(avatar, top, rng), args.out / f"kernels_{label}.txt"
        )
        print(f"{label}, batch {top}:\n" + "\n".join(table.splitlines()[:14]), flush=True)
    del engines

    for mode, fuse in [(m, f) for m in modes for f in (False, True)]:
        label = f"{mode}_rows_fused" if fuse else f"{mode}_rows"
        if elapsed_s() > args.deadline_s:
            print(f"{label}: skipped (deadline)", flush=True)
            continue
        cache_dir = Path(tempfile.mkdtemp(prefix=f"w2l-compile-{mode}-"))
        compiled = Wav2LipBackend(
            weights,
            device="cuda",
            batch_sizes=sizes,
            compile_cache=CompileCache(cache_dir),
            compile_mode=mode,
            fuse_units=fuse,
        )
        compiled.add_avatar(avatar)
        for size in sizes:
            if elapsed_s() > args.deadline_s:
                print(f"{label} batch {size}: skipped (deadline)", flush=True)
                continue
            items = random_items(avatar, size, rng)
            t0 = time.perf_counter()
            compiled.render(items)  # builds the kernels, captures the graph
            build_s = time.perf_counter() - t0
            ok = compiled.compiled is not None
            row = {
                "build_s": build_s,
                "compiled": ok,
                "render_ms": mean_ms(partial(compiled.render, items), args.iters),
            }
            row.update(render_pieces(compiled, size, args.iters))
            row.update(patch_error(reference, compiled, items))
            row["render_frames_per_s"] = size * 1000.0 / row["render_ms"]
            doc["sizes"][size][label] = row
            print(
                f"[{elapsed_s():5.0f} s] {label} batch {size}: "
                + ", ".join(f"{k} {v:.3f}" for k, v in row.items()),
                flush=True,
            )
        if compiled.compiled is not None and elapsed_s() < args.deadline_s:
            top_items = random_items(avatar, max(sizes), rng)
            table = profile_kernels(compiled, top_items, args.out / f"kernels_{label}.txt")
            print(f"{label}, batch {max(sizes)}:\n" + "\n".join(table.splitlines()[:14]), flush=True)
        del compiled
        torch.cuda.empty_cache()
    (args.out / "engine_profile.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
