"""Per-frame CPU of a call's video at 320x320, 1280x720 and 1920x1080, step by step, on one thread.

For each size: the built-in avatar at that size (the 320 px portrait, and its scenes made as
``astronaut-720p`` is), a speaking frame's patch from the built-in backend, then

- ``render``: the built-in backend's mouth warp of one frame (CPU, one torch thread);
- ``old compose``: what lipcast did before per-size planes: the patch pasted into a copy of the RGB frame,
  then the whole frame converted to yuv420p (``paste_patch`` + ``to_yuv420p``);
- ``idle frame``: an idle tick now: the cached planes (a dictionary lookup);
- ``paste``: a speaking tick now: the planes copied and the patch's region converted into them
  (:func:`lipcast.streaming.planes.paste_into_planes`);
- ``wrap``: the planes into the encoder's ``av.VideoFrame`` (one copy);
- ``vp8`` / ``h264``: lipcast's encoders (streaming/encoders.py) at the size's bitrate ceiling, one thread,
  over a sequence of speaking frames (the mouth moves every frame).

CPU time (``time.process_time``) per frame, the median of ``--repeats`` runs::

    python benchmarks/hd_frame_cost.py [--frames 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, not an installed one
import torch  # noqa: E402

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, DEFAULT_AVATAR, load_avatar  # noqa: E402
from lipcast.pipeline.avatar_scene import scene_avatar  # noqa: E402
from lipcast.pipeline.backend import RenderItem  # noqa: E402
from lipcast.pipeline.builtin import BuiltinBackend  # noqa: E402
from lipcast.pipeline.compositing import paste_patch  # noqa: E402
from lipcast.streaming.encoders import (  # noqa: E402
    H264Settings,
    Vp8Settings,
    max_bitrate_bps,
    open_h264,
    open_vp8,
)
from lipcast.streaming.frames import VIDEO_TIME_BASE  # noqa: E402
from lipcast.streaming.planes import IdlePlanes, paste_into_planes, to_yuv420p  # noqa: E402
from lipcast.streaming.sizes import OutputSize  # noqa: E402

SIZES = ((320, 320), (1280, 720), (1920, 1080))


def cpu_ms_per_call(fn: Callable[[int], object], count: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.process_time()
        for i in range(count):
            fn(i)
        runs.append((time.process_time() - start) * 1000.0 / count)
    return statistics.median(runs)


def measure(width: int, height: int, frames: int, repeats: int) -> dict[str, float]:
    from av import VideoFrame

    base = load_avatar(BUILTIN_AVATAR_DIR / DEFAULT_AVATAR)
    avatar = base if (width, height) == (base.width, base.height) else scene_avatar(base, width, height)
    backend = BuiltinBackend(torch.device("cpu"))
    backend.add_avatar(avatar)
    # A syllable's conditionings: the mouth opens and closes over the frames.
    openings = 0.5 + 0.5 * np.sin(np.linspace(0, 6 * np.pi, frames))
    items = [RenderItem(avatar.name, 0, np.array([o, 0.3, 0.2], np.float32)) for o in openings]
    patches = [backend.render([item])[0] for item in items]
    size = OutputSize(width, height)
    idle = IdlePlanes()
    source = avatar.frames[0]
    base_planes = idle.planes(avatar, 0, size)
    place = idle.placement(avatar, size)
    planes = [paste_into_planes(base_planes, place, p, 1.0, source) for p in patches]
    out = {
        "patch_px": float(patches[0].pixels.shape[0] * patches[0].pixels.shape[1]),
        "render": cpu_ms_per_call(lambda i: backend.render([items[i]]), frames, repeats),
        "old compose": cpu_ms_per_call(
            lambda i: to_yuv420p(paste_patch(source, patches[i])), frames, repeats
        ),
        "idle frame": cpu_ms_per_call(lambda i: idle.planes(avatar, 0, size), frames, repeats),
        "paste": cpu_ms_per_call(
            lambda i: paste_into_planes(base_planes, place, patches[i], 1.0, source), frames, repeats
        ),
        "wrap": cpu_ms_per_call(
            lambda i: VideoFrame.from_ndarray(planes[i], format="yuv420p"), frames, repeats
        ),
    }
    bitrate = max_bitrate_bps(width, height)
    for name, opener in (
        ("vp8", lambda: open_vp8(width, height, bitrate, Vp8Settings())),
        ("h264", lambda: open_h264(width, height, bitrate, H264Settings())),
    ):
        runs = []
        for _ in range(repeats):
            codec = opener()
            codec.thread_count = 1
            video = [VideoFrame.from_ndarray(p, format="yuv420p") for p in planes]
            for k, v in enumerate(video):
                v.pts, v.time_base = k * 3600, VIDEO_TIME_BASE
            codec.encode(video[0])  # the keyframe, not counted
            start = time.process_time()
            for v in video[1:]:
                codec.encode(v)
            runs.append((time.process_time() - start) * 1000.0 / (len(video) - 1))
        out[name] = statistics.median(runs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, {os.cpu_count()} cores,"
    )
    print(f"# {platform.processor() or platform.machine()}, commit {commit}; CPU ms per frame, one thread")
    columns = ("render", "old compose", "idle frame", "paste", "wrap", "vp8", "h264")
    print("| size | patch px | " + " | ".join(columns) + " | server (paste+wrap) |")
    print("|---|---|" + "---|" * len(columns) + "---|")
    for width, height in SIZES:
        m = measure(width, height, args.frames, args.repeats)
        cells = " | ".join(f"{m[c]:.3f}" for c in columns)
        print(f"| {width}x{height} | {int(m['patch_px'])} | {cells} | {m['paste'] + m['wrap']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
