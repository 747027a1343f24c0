"""The sharpen stage on a GPU: restorer ms per fixed batch, next to the Wav2Lip step, and engine capacity.

    python benchmarks/sharpen_bench.py --out results.json [--anime animevideov3.pth] [--capacity]

Wav2Lip has random weights (the project ships none; its speed does not depend on them). Restorers:
``general-x4v3``, random weights in realesr-general-x4v3's layout (64 ch, 32 body convs, x4), and, with
``--anime``, the real realesr-animevideov3 weights converted by lipcast.pipeline.enhance.ncnn_convert
(64 ch, 16 body convs). The avatar is the built-in astronaut scaled to 512 x 512 px (its face box then
155 x 168 px). Every figure is the median of repeated renders after warm-up, synchronised (a render
returns when its patches are on the host). Capacity: :func:`lipcast.pipeline.bench_engine.find_capacity`,
simulated 25 fps sessions against the engine alone (no WebRTC, no encoders), every frame on time within
one frame (40 ms), with every session sharpened and with none.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, Avatar, load_avatar  # noqa: E402
from lipcast.pipeline.backend import RenderItem  # noqa: E402
from lipcast.pipeline.bench_engine import find_capacity  # noqa: E402
from lipcast.pipeline.defaults import RENDER_BUDGET_MS  # noqa: E402
from lipcast.pipeline.engine import RenderEngine  # noqa: E402
from lipcast.pipeline.enhance.compact import random_compact_state  # noqa: E402
from lipcast.pipeline.enhance.stage import MouthSharpener  # noqa: E402
from lipcast.pipeline.enhance.weights import load_restorer, restorer_from_state  # noqa: E402
from lipcast.pipeline.wav2lip.backend import Wav2LipBackend  # noqa: E402
from lipcast.pipeline.wav2lip.model import Wav2Lip  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
TIMED = (1, 32, 128)
REPEATS = 30


def scaled_avatar(side_px: int = 512) -> Avatar:
    base = load_avatar(BUILTIN_AVATAR_DIR / "astronaut")
    factor = side_px / base.width
    frames = np.stack([cv2.resize(f, (side_px, side_px), interpolation=cv2.INTER_CUBIC) for f in base.frames])
    boxes = np.round(base.face_boxes * factor).astype(np.int32)
    mouths = (base.mouths * factor).astype(np.float32)
    return Avatar("astronaut512", base.fps, frames, boxes, mouths)


def timed_ms(run, repeats: int = REPEATS) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000.0)
    return round(statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--anime", type=Path, default=None, help="converted realesr-animevideov3 .pth")
    parser.add_argument("--capacity", action="store_true")
    parser.add_argument("--capacity-seconds", type=float, default=2.0)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run (small sizes, few repeats)")
    args = parser.parse_args()
    device = torch.device(args.device)
    global SIZES, TIMED, REPEATS
    if device.type == "cpu":
        SIZES, TIMED, REPEATS = (1, 2), (1, 2), 2
    result: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "avatar_px": 512,
    }

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=1))

    torch.manual_seed(0)
    weights = Wav2Lip().state_dict()
    avatar = scaled_avatar()
    result["face_box_px"] = [int(v) for v in avatar.face_boxes[0]]
    restorers = {
        "general-x4v3": restorer_from_state(random_compact_state(seed=1), "random general-x4v3 layout")
    }
    if args.anime is not None:
        restorers["animevideov3"] = load_restorer(args.anime)
    plain = Wav2LipBackend(weights, device=device, batch_sizes=SIZES)
    plain.add_avatar(avatar)
    backend = Wav2LipBackend(weights, device=device, batch_sizes=SIZES, restorer=restorers["general-x4v3"])
    backend.add_avatar(avatar)
    sharpeners = {"general-x4v3": backend.sharpener}
    for name, restorer in restorers.items():
        if name not in sharpeners:
            sharpener = MouthSharpener(
                restorer,
                device=device,
                region_rows=backend.sharpener.region_rows,
                batch_sizes=SIZES,
                stream=backend._stream,
            )
            sharpener.prepare()
            sharpeners[name] = sharpener
    rng = np.random.default_rng(0)
    mels = rng.uniform(-4, 1, (128, 80, 16)).astype(np.float32)
    if device.type == "cuda":  # the captured graphs against the same stage run eagerly
        eager = Wav2LipBackend(
            weights, device=device, batch_sizes=SIZES, restorer=restorers["general-x4v3"], cuda_graphs=False
        )
        eager.add_avatar(avatar)
        mixed = [RenderItem(avatar.name, 0, mels[i], (0.7, 0.0, 1.0, 0.0)[i]) for i in range(4)]
        diffs = [
            int(np.abs(a.pixels.astype(int) - b.pixels.astype(int)).max())
            for a, b in zip(backend.render(mixed), eager.render(mixed), strict=True)
        ]
        off_rows = [
            bool(np.array_equal(a.pixels, b.pixels))
            for a, b in zip(backend.render(mixed)[1::2], plain.render(mixed)[1::2], strict=True)
        ]
        result["graph_vs_eager_max_abs"] = diffs
        result["off_rows_identical_to_plain"] = off_rows
        del eager

    def batch(size: int, strength: float) -> list[RenderItem]:
        return [RenderItem(avatar.name, 0, mels[i], strength) for i in range(size)]

    with torch.no_grad():
        result["wav2lip_plain_ms"] = {b: timed_ms(lambda b=b: plain.render(batch(b, 0.0))) for b in TIMED}
        result["wav2lip_off_ms"] = {b: timed_ms(lambda b=b: backend.render(batch(b, 0.0))) for b in TIMED}
        save()
        for name, sharpener in sharpeners.items():
            backend.sharpener = sharpener
            face = torch.rand(128, 3, sharpener.region_rows, 96, device=device)

            def restore(size: int, sharpener=sharpener, face=face) -> None:
                with torch.cuda.stream(backend._stream):
                    sharpener.restore(face[:size])
                if backend._stream is not None:
                    backend._stream.synchronize()

            result[name] = {
                "parameters": restorers[name].parameters,
                "restorer_ms": {b: timed_ms(lambda b=b: restore(b)) for b in TIMED},
                "wav2lip_sharpen_ms": {b: timed_ms(lambda b=b: backend.render(batch(b, 0.7))) for b in TIMED},
                "input_px": [sharpener.region_rows, 96],
                "dtype": str(sharpener.dtype),
            }
            save()
        backend.sharpener = sharpeners["general-x4v3"]
        if args.capacity:
            capacity = {}
            for name in sharpeners:
                backend.sharpener = sharpeners[name]
                for label, strength in (("off", 0.0), (name, 0.7)):
                    if label in capacity:
                        continue
                    engine = RenderEngine(backend, SIZES, device=str(device))
                    engine.add_avatar(avatar)
                    engine.start()
                    try:
                        best, steps = find_capacity(
                            engine,
                            avatar,
                            start=64 if device.type == "cuda" else 1,
                            seconds=args.capacity_seconds,
                            budget_ms=RENDER_BUDGET_MS,
                            enhance_strength=strength,
                        )
                    finally:
                        engine.stop()
                    capacity[label] = {"sessions": best, "steps": [s.to_json() for s in steps]}
                    result["capacity"] = capacity
                    save()
    save()
    print(json.dumps({k: v for k, v in result.items() if k != "capacity"}, indent=1))
    if "capacity" in result:
        print({k: v["sessions"] for k, v in result["capacity"].items()})


if __name__ == "__main__":
    main()
