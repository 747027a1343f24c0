"""The two outgoing tracks. They only pace and convert: tick ``k`` leaves at the stream's presentation time.

Video may skip or repeat a frame; audio never skips: every tick's audio leaves, in order, so the audio RTP
clock (counted in samples by the Opus encoder) and the video RTP clock (from the tick index) advance together.
"""

from __future__ import annotations

import fractions
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import cv2
import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame

from pipeline.compositing import paste_patch
from pipeline.engine import DeadlineExpiredError
from pipeline.windows import OUTPUT_SAMPLE_RATE_HZ
from streaming.avatar_stream import AvatarStream, FrameMeta, Tick

logger = logging.getLogger(__name__)

VIDEO_CLOCK_HZ = 90_000
VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK_HZ)
AUDIO_TIME_BASE = fractions.Fraction(1, OUTPUT_SAMPLE_RATE_HZ)


def video_frame(image: npt.NDArray[np.uint8], pixel_format: str = "yuv420p") -> VideoFrame:
    """An RGB (h, w, 3) image as a frame the VP8 encoder takes as it is.

    The encoder needs yuv420p; handed rgb24 it converts each frame with swscale, which cost 1.4 ms of CPU per
    320x320 frame here against 0.05 ms for OpenCV's conversion (the same BT.601 limited-range matrix; chroma
    averaged over 2x2 pixels). Odd sizes, which 4:2:0 cannot hold exactly, stay rgb24.
    """
    height, width = image.shape[:2]
    if pixel_format == "rgb24" or height % 2 or width % 2:
        return VideoFrame.from_ndarray(image, format="rgb24")
    planes = cast(npt.NDArray[np.uint8], cv2.cvtColor(image, cv2.COLOR_RGB2YUV_I420))  # (1.5 h, w)
    return VideoFrame.from_ndarray(planes, format="yuv420p")


@dataclass
class VideoStats:
    sent: int = 0
    late: int = 0  # render not ready at presentation: previous frame repeated
    skipped: int = 0  # the sender fell behind: frames not sent at all
    failed: int = 0  # render raised: avatar frame shown as it is


class _StreamTrack(MediaStreamTrack):
    """A track paced by an :class:`AvatarStream`."""

    stream: AvatarStream

    async def _running_stream(self) -> AvatarStream:
        """The stream once it runs; ends the track (MediaStreamError) if it stopped or never started."""
        if self.readyState != "live":
            raise MediaStreamError
        await self.stream.started.wait()
        if self.stream.closed:
            self.stop()
            raise MediaStreamError
        return self.stream


class AvatarVideoTrack(_StreamTrack):
    kind = "video"

    def __init__(
        self,
        stream: AvatarStream,
        on_frame: Callable[[FrameMeta], None] | None = None,
        *,
        pixel_format: str = "rgb24",
    ) -> None:
        """``pixel_format``: "rgb24", or "yuv420p" (what the VP8 encoder takes, converted here at a 30th of
        swscale's cost; see :func:`video_frame`). Not the default yet: with it the probe's black-box mouth
        onset came out 2 frames after the metadata's on one burst of its test, not yet explained."""
        super().__init__()
        if pixel_format not in ("yuv420p", "rgb24"):
            raise ValueError(f"pixel_format must be yuv420p or rgb24, got {pixel_format!r}")
        self.stream = stream
        self.on_frame = on_frame
        self.pixel_format = pixel_format
        self.stats = VideoStats()
        self._next = 0
        self._last: npt.NDArray[np.uint8] | None = None

    def start_at(self, index: int) -> None:
        """Join a running stream at tick ``index`` instead of tick 0 (a viewer arriving late)."""
        self._next = index

    async def recv(self) -> VideoFrame:
        stream = await self._running_stream()
        index = self._next
        await stream.clock.sleep_until(stream.present_time(index))
        # Fell behind by more than a frame (slow encoder, stalled loop): jump to the newest tick.
        assert stream.timeline is not None
        newest = stream.timeline.index_at(stream.clock.now() - stream.render_budget_s)
        if newest > index:
            self.stats.skipped += newest - index
            index = newest
        tick = await stream.get(index)
        self._next = index + 1
        if tick is None or self.readyState != "live":  # the stream closed under us
            self.stop()
            raise MediaStreamError
        composing = time.perf_counter()
        image, late = self._image(tick)
        frame = video_frame(image, self.pixel_format)
        compose_ms = (time.perf_counter() - composing) * 1000.0
        frame.pts = index * (VIDEO_CLOCK_HZ // stream.grid.fps)
        frame.time_base = VIDEO_TIME_BASE
        self.stats.sent += 1
        if self.on_frame is not None:
            self.on_frame(self._meta(tick, late, compose_ms))
        return frame

    def _image(self, tick: Tick) -> tuple[npt.NDArray[np.uint8], bool]:
        base = self.stream.avatar.frames[tick.frame_index]
        future = tick.patch
        if future is None:
            image = base
        elif not future.done() or (
            not future.cancelled() and isinstance(future.exception(), DeadlineExpiredError)
        ):
            self.stats.late += 1
            return (self._last if self._last is not None else base), True
        elif future.cancelled() or future.exception() is not None:
            self.stats.failed += 1
            image = base
        else:
            image = paste_patch(base, future.result(), tick.mix)
        self._last = image
        return image, False

    def _meta(self, tick: Tick, late: bool, compose_ms: float) -> FrameMeta:
        stages = {"features": round(tick.featurize_ms, 3), "compose": round(compose_ms, 3)}
        if tick.render_ms is not None:
            stages["render"] = round(tick.render_ms, 3)
        return FrameMeta(
            frame=tick.index,
            avatar_frame=tick.frame_index,
            input_pos_ms=(
                None if tick.input_pos is None else tick.input_pos * 1000.0 / OUTPUT_SAMPLE_RATE_HZ
            ),
            speech=tick.speech,
            active=tick.patch is not None,
            mouth=[round(float(v), 4) for v in tick.conditioning.reshape(-1)[:3]],
            late=late,
            stages_ms=stages,
        )


class AvatarAudioTrack(_StreamTrack):
    """Sends each tick's audio as 20 ms frames: aiortc puts every frame it is given into one RTP timestamp,
    and an Opus packet is 20 ms, so a 40 ms frame would become two packets the receiver cannot tell apart."""

    kind = "audio"
    FRAME_MS = 20

    def __init__(self, stream: AvatarStream) -> None:
        super().__init__()
        self.stream = stream
        self.sent = 0
        self.lost_ticks = 0
        self._next = 0  # in 20 ms frames
        self._per_tick = round(stream.grid.frame_ms / self.FRAME_MS)
        self._tick_audio: npt.NDArray[np.int16] | None = None

    def start_at(self, tick_index: int) -> None:
        """Join a running stream at tick ``tick_index`` instead of tick 0, so a late listener does not get a
        burst of old audio; call before the first ``recv``."""
        self._next = tick_index * self._per_tick

    async def recv(self) -> AudioFrame:
        stream = await self._running_stream()
        tick_index, part = divmod(self._next, self._per_tick)
        await stream.clock.sleep_until(stream.present_time(tick_index) + part * self.FRAME_MS / 1000.0)
        if part == 0:
            tick = await stream.get(tick_index)
            if stream.closed or self.readyState != "live":
                self.stop()
                raise MediaStreamError
            if tick is None:
                # Only possible if this sender stalled for longer than the stream keeps ticks; send silence
                # so the timeline stays continuous, and count it.
                self.lost_ticks += 1
                self._tick_audio = np.zeros(stream.samples_per_tick, np.int16)
            else:
                self._tick_audio = tick.audio
        assert self._tick_audio is not None
        size = len(self._tick_audio) // self._per_tick
        samples = self._tick_audio[part * size : (part + 1) * size]
        # Stereo with both channels equal: aiortc's Opus encoder upmixes mono at -3 dB, the caller's voice
        # should come back at the level it went in.
        interleaved = np.repeat(samples, 2).reshape(1, -1)
        frame = AudioFrame.from_ndarray(interleaved, format="s16", layout="stereo")
        frame.sample_rate = OUTPUT_SAMPLE_RATE_HZ
        frame.pts = self._next * size
        frame.time_base = AUDIO_TIME_BASE
        self._next += 1
        self.sent += 1
        return frame
