"""Each tick's picture, composed once per session and shared by every consumer of the session's video.

A session's video has several consumers: the caller's track, the viewers' shared encoder
(:mod:`streaming.fanout`) and the virtual camera. Each paces itself on the session's one media clock
(:class:`~streaming.avatar_stream.AvatarStream`) and asks for tick ``k`` at its presentation time; the first
to ask composes it (the rendered patch pasted into the avatar frame, or the previous picture repeated when the
render is late), the others get the same :class:`ComposedFrame`. So the late/failed decision is taken once
per tick and every consumer shows identical pixels.

Shared means read-only: the picture is a numpy array flagged not writeable. Each consumer wraps it in an
``av.VideoFrame`` of its own (:meth:`ComposedFrame.video_frame`, one copy of the pixels): PyAV frames are
not safe to share between threads (``reformat`` keeps a converter on the frame, and the caller's and the
viewers' encoders convert at the same time in executor threads), and aiortc's encoders write ``pict_type``
on the frame they are given.
"""

from __future__ import annotations

import fractions
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from av import VideoFrame

from pipeline.avatar import Avatar
from pipeline.compositing import paste_patch
from pipeline.engine import DeadlineExpiredError
from pipeline.timing import VIDEO_CLOCK_HZ

if TYPE_CHECKING:  # avatar_stream imports this module
    from streaming.avatar_stream import Tick

VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK_HZ)
# Composed frames kept for consumers that ask for a tick after another did. Every consumer asks for the
# newest presented tick or a later one (a track that falls behind jumps ahead), so two would do; four leave
# room for a consumer that is a frame or two slower than the first. At 320x320: ~1.2 MB per session.
KEEP_COMPOSED_FRAMES = 4

Image = npt.NDArray[np.uint8]


@dataclass(frozen=True, eq=False)
class ComposedFrame:
    """Tick ``index`` as it leaves: the same object for every consumer (read-only, see the module doc)."""

    index: int
    image: Image  # (H, W, 3) RGB, not writeable
    pts: int  # on the 90 kHz video clock
    late: bool  # the render was not ready at presentation: the previous picture is repeated
    failed: bool  # the render raised: the avatar frame as it is
    compose_ms: float  # the time composing took (once, by the first consumer)

    def video_frame(self) -> VideoFrame:
        """A new rgb24 ``av.VideoFrame`` of the picture, for one consumer (see the module doc)."""
        video = VideoFrame.from_ndarray(self.image, format="rgb24")
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
