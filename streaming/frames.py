"""Each tick's picture, composed once per session and shared by every consumer of the session's video.

A session's video has several consumers: the caller's track, the viewers' shared encoder
(:mod:`lipcast.streaming.fanout`) and the virtual camera. Each paces itself on the session's one media clock
(:class:`~lipcast.streaming.avatar_stream.AvatarStream`) and asks for tick ``k`` at its presentation time; the
first to ask composes it (the rendered patch pasted into the avatar frame, or the previous picture repeated
when the render is late), the others get the same :class:`ComposedFrame`. So the late/failed decision is taken
once per tick and every consumer shows identical pixels.

Shared means read-only: the picture is a numpy array flagged not writeable. Each consumer wraps it in an
``av.VideoFrame`` of its own (:meth:`ComposedFrame.video_frame`, one copy of the pixels): PyAV frames are
not safe to share between threads (``reformat`` keeps a converter on the frame, and the caller's and the
viewers' encoders run at the same time in executor threads), and aiortc's encoders write ``pict_type``
on the frame they are given.

The VP8 encoders take yuv420p. Handed rgb24, each converts every frame with swscale in its thread: 1.2-1.4
ms of CPU per 320x320 frame here with the rgb24 frame's copy. The picture is converted here instead, once
per tick for all encoders, to the same planes to within 1 (:func:`to_yuv420p`: 0.48 ms).
"""

from __future__ import annotations

import fractions
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import cv2
import numpy as np
import numpy.typing as npt
from av import VideoFrame

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.compositing import paste_patch
from lipcast.pipeline.engine import DeadlineExpiredError
from lipcast.pipeline.timing import VIDEO_CLOCK_HZ
from lipcast.streaming.tick import Tick

VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK_HZ)
# Composed frames kept for consumers that ask for a tick after another did. Every consumer asks for the
# newest presented tick or a later one (a track that falls behind jumps ahead), so two would do; four leave
# room for a consumer that is a frame or two slower than the first. At 320x320: ~1.2 MB per session.
KEEP_COMPOSED_FRAMES = 4

Image = npt.NDArray[np.uint8]


def to_yuv420p(image: Image) -> Image:
    """An (H, W, 3) RGB picture of even size as yuv420p planes, (1.5 H, W): Y, then U, then V; what
    swscale (aiortc's conversion) makes of it, to within 1 (BT.601, limited range).

    Luma is OpenCV's. Chroma is not: OpenCV's RGB -> I420 takes each 2x2 block's chroma from its top-left
    pixel alone, where swscale averages each pair of columns and filters rows 1-3-3-1 (rows 2i-1 .. 2i+2).
    Point-sampled chroma is aliased; over VP8 at 40 kbps it left the resting mouth 25 % further (in
    chroma) from the call's first frames, which raised the probe's motion threshold above the second frame
    of a mouth opening: its black-box onset came a frame late. So the chroma is filtered as swscale does,
    on the RGB values (the conversion is affine), then converted by OpenCV at quarter size.
    """
    height, width = image.shape[:2]
    planes = cast(Image, cv2.cvtColor(image, cv2.COLOR_RGB2YUV_I420))
    # Column pairs averaged (an exact 2:1 linear resize), then rows 1-3-3-1 / 8, edge rows repeated.
    half = cv2.resize(image.astype(np.float32), (width // 2, height), interpolation=cv2.INTER_LINEAR)
    even, odd = half[0::2], half[1::2]
    above = np.concatenate([half[:1], odd[:-1]])
    below = np.concatenate([even[1:], half[-1:]])
    rgb = (even + odd) * (3.0 / (8.0 * 255.0)) + (above + below) * (1.0 / (8.0 * 255.0))  # in 0..1
    ycc = cv2.cvtColor(rgb, cv2.COLOR_RGB2YCrCb)  # full-range Cr, Cb around 0.5
    chroma = cv2.convertScaleAbs(ycc, alpha=224.0, beta=16.0)  # limited range: (c - 0.5) * 224 + 128
    count = (height // 2) * (width // 2)
    flat = planes.reshape(-1)
    flat[height * width : height * width + count] = chroma[:, :, 2].reshape(-1)  # U = Cb
    flat[height * width + count :] = chroma[:, :, 1].reshape(-1)  # V = Cr
    return planes


@dataclass(frozen=True, eq=False)
class ComposedFrame:
    """Tick ``index`` as it leaves: the same object for every consumer (read-only, see the module doc)."""

    index: int
    image: Image  # (H, W, 3) RGB, not writeable
    pts: int  # on the 90 kHz video clock
    late: bool  # the render was not ready at presentation: the previous picture is repeated
    failed: bool  # the render raised: the avatar frame as it is
    compose_ms: float  # the time composing took (once, by the first consumer)
    _yuv: list[Image] = field(default_factory=list, repr=False)  # the yuv420p planes, once converted

    def yuv420p(self) -> Image:
        """The picture as yuv420p planes (read-only), converted on the first call (on the event loop)."""
        if not self._yuv:
            planes = to_yuv420p(self.image)
            planes.flags.writeable = False
            self._yuv.append(planes)
        return self._yuv[0]

    def video_frame(self, pixel_format: str = "yuv420p") -> VideoFrame:
        """A new ``av.VideoFrame`` of the picture for one consumer (see the module doc): yuv420p, what the
        VP8 encoders take, or rgb24. A picture of odd size, which 4:2:0 cannot hold, is always rgb24."""
        height, width = self.image.shape[:2]
        if pixel_format == "yuv420p" and not (height % 2 or width % 2):
            video = VideoFrame.from_ndarray(self.yuv420p(), format="yuv420p")
        elif pixel_format in ("yuv420p", "rgb24"):
            video = VideoFrame.from_ndarray(self.image, format="rgb24")
        else:
            raise ValueError(f"pixel_format must be yuv420p or rgb24, got {pixel_format!r}")
        video.pts = self.pts
        video.time_base = VIDEO_TIME_BASE
        return video


@dataclass
class CompositorStats:
    composed: int = 0  # frames composed (one per tick asked for)
    pasted: int = 0  # of which a rendered patch was pasted into the avatar frame
    shared: int = 0  # requests answered with a frame another consumer had composed


def read_only(image: Image) -> Image:
    """A view of ``image`` that cannot be written through."""
    view = image.view()
    view.flags.writeable = False
    return view


class SharedFrames:
    """Composes each tick of one stream once and keeps the last few for the stream's other consumers."""

    def __init__(
        self,
        avatar: Avatar,
        fps: int,
        *,
        keep_frames: int = KEEP_COMPOSED_FRAMES,
        perf_counter: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.avatar = avatar
        self.pts_step = VIDEO_CLOCK_HZ // fps
        self.keep_frames = max(1, keep_frames)
        self.stats = CompositorStats()
        self._perf = perf_counter
        self._frames: dict[int, ComposedFrame] = {}
        self._last: Image | None = None  # the newest picture not repeated from an earlier one
        self._last_index = -1

    def compose(self, tick: Tick) -> ComposedFrame:
        """Tick ``tick.index`` as a frame; composed on the first call, the same object on later ones.

        Call at or after the tick's presentation time: whether its render is late is decided now.
        """
        frame = self._frames.get(tick.index)
        if frame is not None:
            self.stats.shared += 1
            return frame
        started = self._perf()
        image, late, failed = self._image(tick)
        compose_ms = (self._perf() - started) * 1000.0
        frame = ComposedFrame(tick.index, image, tick.index * self.pts_step, late, failed, compose_ms)
        self.stats.composed += 1
        self._frames[tick.index] = frame
        while len(self._frames) > self.keep_frames:
            del self._frames[min(self._frames)]
        return frame

    def clear(self) -> None:
        self._frames.clear()
        self._last = None
        self._last_index = -1

    def _image(self, tick: Tick) -> tuple[Image, bool, bool]:
        """(picture, late, failed) for ``tick``; a late render repeats the newest picture before it."""
        base = self.avatar.frames[tick.frame_index]
        future = tick.patch
        failed = False
        if future is None:
            image = read_only(base)
        elif not future.done() or (
            not future.cancelled() and isinstance(future.exception(), DeadlineExpiredError)
        ):
            return (self._last if self._last is not None else read_only(base)), True, False
        elif future.cancelled() or future.exception() is not None:
            failed = True
            image = read_only(base)
        else:
            image = paste_patch(base, future.result(), tick.mix)
            image.flags.writeable = False
            self.stats.pasted += 1
        if tick.index > self._last_index:
            self._last, self._last_index = image, tick.index
        return image, False, failed
