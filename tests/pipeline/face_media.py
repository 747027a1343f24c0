"""Test inputs for avatar preparation: a drawn face (video or still), the astronaut photo moved around.

Everything is made on the fly, small, and written with PyAV (libx264 or mpeg4) or OpenCV (PNG).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, DEFAULT_AVATAR

UInt8Array = npt.NDArray[np.uint8]

SKIN_RGB = (225, 180, 150)
BACKGROUND_RGB = (120, 90, 70)


def drawn_face(
    width: int = 160,
    height: int = 160,
    center: tuple[float, float] = (80.0, 78.0),
    scale: float = 1.0,
    mouth_open: float = 0.0,
) -> UInt8Array:
    """An RGB cartoon face (skin oval, brows, eyes, nose, mouth) that OpenCV's Haar cascade finds.

    The face is about ``68 * scale`` px wide; its mouth centre is 24 * scale px below ``center``.
    """
    image = np.zeros((height, width, 3), np.uint8)
    image[:] = BACKGROUND_RGB
    cx, cy = (round(c) for c in center)

    def px(v: float) -> int:
        return max(1, round(v * scale))

    cv2.ellipse(image, (cx, cy), (px(34), px(44)), 0, 0, 360, SKIN_RGB, -1)
    image = cv2.GaussianBlur(image, (0, 0), 1.5)
    eye_y = cy - px(10)
    for side in (-1, 1):
        eye = (cx + side * px(13), eye_y)
        cv2.ellipse(image, (eye[0], eye[1] - px(9)), (px(9), px(3)), 0, 180, 360, (90, 70, 60), -1)
        cv2.ellipse(image, eye, (px(7), px(4)), 0, 0, 360, (235, 235, 235), -1)
        cv2.circle(image, eye, px(3), (20, 30, 40), -1)
    cv2.line(image, (cx, eye_y + px(3)), (cx - px(3), cy + px(10)), (185, 140, 110), 2)
    cv2.ellipse(image, (cx, cy + px(11)), (px(5), px(2)), 0, 0, 360, (185, 140, 110), -1)
    mouth_h = max(1, round(scale * (2 + 6 * mouth_open)))
    cv2.ellipse(image, (cx, cy + px(24)), (px(12), mouth_h), 0, 0, 360, (150, 60, 60), -1)
    return np.ascontiguousarray(cv2.GaussianBlur(image, (0, 0), 0.8))


def drawn_face_frames(count: int, width: int = 160, height: int = 160) -> list[UInt8Array]:
    """A drawn face that drifts a few pixels, sways in size and talks."""
    frames = []
    for k in range(count):
        phase = 2 * np.pi * k / max(1, count)
        center = (width / 2 + 4 * np.sin(phase), height / 2 - 2 + 2 * np.cos(phase))
        frames.append(
            drawn_face(width, height, center, scale=1.0 + 0.03 * np.sin(2 * phase), mouth_open=(k % 5) / 4)
        )
    return frames


def astronaut_frames(count: int, width: int, height: int, face_px: float = 0.0) -> list[UInt8Array]:
    """The default avatar's photo on a ``width x height`` canvas, slowly moving and zooming.

    ``face_px`` 0 keeps the photo's size; else it is scaled so the face is about that many pixels wide.
    """
    photo = cv2.cvtColor(
        cv2.imread(str(BUILTIN_AVATAR_DIR / DEFAULT_AVATAR / "frames" / "000000.png")), cv2.COLOR_BGR2RGB
    )
    base_scale = 1.0 if face_px <= 0 else face_px / 97.0  # the photo's face is 97 px wide
    canvas = np.zeros((height, width, 3), np.uint8)
    canvas[:] = (30, 40, 60)
    frames = []
    for k in range(count):
        t = k / max(1, count)
        s = base_scale * (1.0 + 0.04 * np.sin(2 * np.pi * t))
        dx = width / 2 - 160 * s + 10 * s * np.sin(2 * np.pi * t)
        dy = height / 2 - 160 * s + 6 * s * np.cos(2 * np.pi * t)
        matrix = np.array([[s, 0, dx], [0, s, dy]], np.float64)
        frames.append(
            cv2.warpAffine(
                photo, matrix, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
            )
        )
    return frames


def encode_video(path: Path, frames: list[UInt8Array], fps: int = 25, codec: str = "libx264") -> Path:
    """Write RGB frames as a video file (H.264 in MP4 by default; mpeg4 where libx264 is missing)."""
    try:
        av.codec.Codec(codec, "w")
    except Exception:
        codec = "mpeg4"
    height, width = frames[0].shape[:2]
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        if codec == "libx264":
            stream.options = {"preset": "ultrafast", "crf": "18"}
        for k, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = k
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_image(path: Path, rgb: UInt8Array) -> Path:
    if not cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
        raise OSError(f"cannot write {path}")
    return path
