"""VP8 settings on real avatar frames: encode CPU per frame, bitrate and picture quality per setting.

The frames are the built-in backend's composed pictures of the probe's burst pattern (12 s, speech and
rest), encoded with lipcast's encoder settings (streaming/encoders.py) on one thread, decoded, and compared
with the yuv420p input (PSNR and SSIM of luma, the whole picture and the mouth box)::

    python benchmarks/vp8_settings.py                       # cpu-used -6 -8 -10 -12 -16, denoiser 4 and 0
    python benchmarks/vp8_settings.py --bitrates 500000 --cpu-used -6 -16 --noise 0
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import wave
from pathlib import Path

import av
import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, not an installed one
import lipcast.pipeline.offline as offline  # noqa: E402
from lipcast.probe.patterns import burst_pattern  # noqa: E402
from lipcast.streaming.encoders import Vp8Settings, open_vp8  # noqa: E402
from lipcast.streaming.frames import to_yuv420p  # noqa: E402


def composed_frames(seconds: float) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """The built-in backend's composed pictures of the burst pattern, and the probe's mouth box."""
    from lipcast.server.routes import avatar_json
    from lipcast.server.tools_cli import _engine

    frames: list[np.ndarray] = []

    class Collect(offline._Writer):
        def __init__(self, path: Path, avatar: object, fps: int) -> None:
            pass

        def __exit__(self, *exc: object) -> None:
            pass

        def audio(self, *args: object, **kwargs: object) -> None:
            pass

        def video(self, base: np.ndarray, patch: object) -> None:
            frames.append(base if patch is None else offline.paste_patch(base, patch))  # type: ignore[arg-type]

    offline._Writer = Collect  # type: ignore[misc]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pattern.wav"
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(48000)
            w.writeframes(burst_pattern(seconds, seed=1).tobytes())
        args = argparse.Namespace(backend="builtin", checkpoint=None, device="cpu", batch_sizes=None)
        engine, avatar, _ = _engine(args, None)
        engine.start()
        try:
            offline.render_file(engine, avatar, path, Path(tmp) / "unused.mp4")
        finally:
            engine.stop()
    x1, y1, x2, y2 = avatar_json(avatar)["mouth_box"]
    return np.stack(frames), (x1, y1, x2, y2)


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def blur(x: np.ndarray) -> np.ndarray:
        return cv2.GaussianBlur(x, (11, 11), 1.5)

    ma, mb = blur(a), blur(b)
    va, vb, cov = blur(a * a) - ma * ma, blur(b * b) - mb * mb, blur(a * b) - ma * mb
    return float((((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))).mean())


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255 * 255 / max(mse, 1e-9))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--bitrates", type=int, nargs="+", default=[1_500_000, 500_000])
    p.add_argument("--cpu-used", type=int, nargs="+", default=[-6, -8, -10, -12, -16])
    p.add_argument("--noise", type=int, nargs="+", default=[4, 0])
    args = p.parse_args()
    frames, (x1, y1, x2, y2) = composed_frames(args.seconds)
    height, width = frames.shape[1:3]
    count = len(frames)
    started = time.thread_time()
    for f in frames:
        av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p")
    swscale_ms = (time.thread_time() - started) / count * 1000
    started = time.thread_time()
    planes = [to_yuv420p(f) for f in frames]
    ours_ms = (time.thread_time() - started) / count * 1000
    print(
        f"{count} frames {width}x{height}; rgb24 + swscale {swscale_ms:.3f} ms, to_yuv420p {ours_ms:.3f} ms"
    )
    for bitrate in args.bitrates:
        for noise in args.noise:
            for cpu_used in args.cpu_used:
                encoder = open_vp8(width, height, bitrate, Vp8Settings(cpu_used, noise))
                encoder.thread_count = 1
                decoder = av.CodecContext.create("libvpx", "r")
                sources = [av.VideoFrame.from_ndarray(p, format="yuv420p") for p in planes]
                started = time.thread_time()
                packets = []
                for i, frame in enumerate(sources):
                    frame.pts = i
                    packets.append(b"".join(bytes(p) for p in encoder.encode(frame)))
                encode_ms = (time.thread_time() - started) / count * 1000
                whole, mouth, structure = [], [], []
                for i, data in enumerate(packets):
                    luma = decoder.decode(av.Packet(data))[0].to_ndarray()[:height]
                    reference = planes[i][:height]
                    if i >= 10:  # past the first keyframe's start-up
                        whole.append(psnr(luma, reference))
                        mouth.append(psnr(luma[y1:y2, x1:x2], reference[y1:y2, x1:x2]))
                        structure.append(ssim(luma, reference))
                kbps = sum(len(d) for d in packets) * 8 * 25 / count / 1000
                print(
                    f"bitrate {bitrate // 1000:5d}k noise-sensitivity {noise} cpu-used {cpu_used:4d}: "
                    f"encode {encode_ms:.3f} ms/frame, {kbps:.0f} kbps, PSNR-Y {np.mean(whole):.2f} dB "
                    f"(min {np.min(whole):.2f}), mouth {np.mean(mouth):.2f} (min {np.min(mouth):.2f}), "
                    f"SSIM-Y {np.mean(structure):.4f} (min {np.min(structure):.4f})"
                )


if __name__ == "__main__":
    main()
