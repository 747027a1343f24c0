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

The encoders take yuv420p. Handed rgb24, each converts every frame with swscale in its thread: 1.2-1.4
ms of CPU per 320x320 frame here with the rgb24 frame's copy, 2.2 ms at 1280x720. The picture is made here
instead, once per tick and output size for all encoders: the avatar frame's planes at that size are
converted once for the process (:class:`~lipcast.streaming.planes.IdlePlanes`), and a tick with a render
copies them and writes the patch's region in (:func:`~lipcast.streaming.planes.paste_into_planes`). The
RGB picture (``image``) is made only for a consumer that asks for it (the virtual camera).
"""

from __future__ import annotations

import fractions
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from av import VideoFrame

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderedPatch
from lipcast.pipeline.compositing import paste_patch
from lipcast.pipeline.engine import DeadlineExpiredError
from lipcast.pipeline.timing import VIDEO_CLOCK_HZ
from lipcast.streaming.planes import IDLE_PLANES, IdlePlanes, frame_planes, paste_into_planes, to_yuv420p
from lipcast.streaming.sizes import OutputSize, placement
from lipcast.streaming.tick import Tick

VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK_HZ)
# Composed frames kept for consumers that ask for a tick after another did. Every consumer asks for the
# newest presented tick or a later one (a track that falls behind jumps ahead), so two would do; four leave
# room for a consumer that is a frame or two slower than the first.
KEEP_COMPOSED_FRAMES = 4

Image = npt.NDArray[np.uint8]

__all__ = ["ComposedFrame", "FrameContent", "SharedFrames", "to_yuv420p"]


@dataclass(eq=False)
class FrameContent:
    """What a tick shows: an avatar frame, with a rendered patch over it (weight ``mix``) or not; or any
    picture (``image``, a warm-up's). Its pictures (RGB at the avatar's size, planes at each output size)
    are made on first use and kept: a late tick repeating it shares them."""

    avatar: Avatar | None
    frame_index: int = 0
    patch: RenderedPatch | None = None
    mix: float = 1.0
    idle: IdlePlanes = IDLE_PLANES
    image: Image | None = None
    _planes: dict[OutputSize, Image] = field(default_factory=dict)
    _planes_ms: dict[OutputSize, float] = field(default_factory=dict)  # what making them took, once
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def planes_ms(self, size: OutputSize) -> float:
        """The time making the planes at ``size`` took (0 if not made, or made by no one: the idle cache)."""
        return self._planes_ms.get(size, 0.0)

    @property
    def native_size(self) -> OutputSize:
        if self.avatar is not None:
            return OutputSize(self.avatar.width, self.avatar.height)
        assert self.image is not None
        return OutputSize(self.image.shape[1], self.image.shape[0])

    def rgb(self) -> Image:
        if self.image is None:
            assert self.avatar is not None
            base = self.avatar.frames[self.frame_index]
            if self.patch is None:
                image = read_only(base)
            else:
                image = paste_patch(base, self.patch, self.mix)
                image.flags.writeable = False
            self.image = image
        return self.image

    def planes(self, size: OutputSize) -> Image:
        """The picture at ``size`` as yuv420p planes (read-only), made on the first call for that size."""
        planes = self._planes.get(size)
        if planes is not None:
            return planes
        with self._lock:  # two encoder threads asking at once convert once
            planes = self._planes.get(size)
            if planes is not None:
                return planes
            started = time.perf_counter()
            if self.avatar is None:
                assert self.image is not None
                planes = frame_planes(self.image, placement(self.image.shape[1], self.image.shape[0], size))
            else:
                base = self.idle.planes(self.avatar, self.frame_index, size)
                if self.patch is None:
                    planes = base
                else:
                    place = self.idle.placement(self.avatar, size)
                    source = self.avatar.frames[self.frame_index]
                    planes = paste_into_planes(base, place, self.patch, self.mix, source)
            planes.flags.writeable = False
            self._planes[size] = planes
            self._planes_ms[size] = (time.perf_counter() - started) * 1000.0
            return planes


@dataclass(frozen=True, eq=False)
class ComposedFrame:
    """Tick ``index`` as it leaves: the same object for every consumer (read-only, see the module doc)."""

    index: int
    content: FrameContent
    pts: int  # on the 90 kHz video clock
    late: bool  # the render was not ready at presentation: the previous picture is repeated
    failed: bool  # the render raised: the avatar frame as it is
    compose_ms: float  # the time deciding what the tick shows took (once, by the first consumer)

    @classmethod
    def of_image(cls, index: int, image: Image, pts: int) -> ComposedFrame:
        """A frame of any RGB picture (a warm-up's)."""
        return cls(index, FrameContent(None, image=read_only(image)), pts, False, False, 0.0)

    @property
    def image(self) -> Image:
        """(H, W, 3) RGB at the avatar's own size, not writeable; made on first use."""
        return self.content.rgb()

    @property
    def size(self) -> OutputSize:
        """The avatar's own size (the default output size)."""
        return self.content.native_size

    def yuv420p(self, size: OutputSize | None = None) -> Image:
        """The picture as yuv420p planes (read-only) at ``size`` (None: the avatar's own), made on the
        first call for that size."""
        return self.content.planes(size or self.content.native_size)

    def video_frame(self, pixel_format: str = "yuv420p", size: OutputSize | None = None) -> VideoFrame:
        """A new ``av.VideoFrame`` of the picture for one consumer (see the module doc): yuv420p at
        ``size`` (None: the avatar's own), what the encoders take, or rgb24 (the avatar's size). A picture of
        odd size, which 4:2:0 cannot hold, is always rgb24."""
        native = self.content.native_size if size is None else None
        odd = native is not None and (native.height % 2 or native.width % 2)
        if pixel_format == "yuv420p" and not odd:
            video = VideoFrame.from_ndarray(self.yuv420p(size), format="yuv420p")
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
        idle: IdlePlanes = IDLE_PLANES,
    ) -> None:
        self.avatar = avatar
        self.pts_step = VIDEO_CLOCK_HZ // fps
        self.keep_frames = max(1, keep_frames)
        self.stats = CompositorStats()
        self._perf = perf_counter
        self._frames: dict[int, ComposedFrame] = {}
        self.idle = idle
        self._last: FrameContent | None = None  # the newest picture not repeated from an earlier one
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
        content, late, failed = self._content(tick)
        compose_ms = (self._perf() - started) * 1000.0
        frame = ComposedFrame(tick.index, content, tick.index * self.pts_step, late, failed, compose_ms)
        self.stats.composed += 1
        self._frames[tick.index] = frame
        while len(self._frames) > self.keep_frames:
            del self._frames[min(self._frames)]
        return frame

    def clear(self) -> None:
        self._frames.clear()
        self._last = None
        self._last_index = -1

    def _content(self, tick: Tick) -> tuple[FrameContent, bool, bool]:
        """(content, late, failed) for ``tick``; a late render repeats the newest content before it."""
        base = FrameContent(self.avatar, tick.frame_index, idle=self.idle)
        future = tick.patch
        failed = False
        if future is None:
            content = base
        elif not future.done() or (
            not future.cancelled() and isinstance(future.exception(), DeadlineExpiredError)
        ):
            return (self._last if self._last is not None else base), True, False
        elif future.cancelled() or future.exception() is not None:
            failed = True
            content = base
        else:
            content = FrameContent(self.avatar, tick.frame_index, future.result(), tick.mix, idle=self.idle)
            self.stats.pasted += 1
        if tick.index > self._last_index:
            self._last, self._last_index = content, tick.index
        return content, False, failed
