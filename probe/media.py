"""The probe's media: a paced audio source that records when each sample left, and receivers that record
when each frame arrived (with only the pixels a measurement needs)."""

from __future__ import annotations

import asyncio
import fractions
import time
from dataclasses import dataclass, field
from typing import Any, cast

import cv2
import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, AudioResampler, VideoFrame

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ, OPUS_PACKET_SAMPLES

TIME_BASE = fractions.Fraction(1, MEDIA_SAMPLE_RATE_HZ)


class PatternAudioTrack(MediaStreamTrack):
    """Sends ``audio`` (48 kHz mono int16) in real time, then silence; records each packet's send time."""

    kind = "audio"

    def __init__(self, audio: npt.NDArray[np.int16]) -> None:
        super().__init__()
        self.audio = audio
        self.sent_at: list[float] = []  # wall time (time.monotonic) of packet i = samples [960 i, 960 (i+1))
        self._start: float | None = None
        self.done = asyncio.Event()  # set once the last sample of ``audio`` has been sent

    @property
    def finished(self) -> bool:
        return len(self.sent_at) * OPUS_PACKET_SAMPLES >= len(self.audio)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        index = len(self.sent_at)
        if self._start is None:
            self._start = time.monotonic()
        delay_s = self._start + index * OPUS_PACKET_SAMPLES / MEDIA_SAMPLE_RATE_HZ - time.monotonic()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        chunk = self.audio[index * OPUS_PACKET_SAMPLES : (index + 1) * OPUS_PACKET_SAMPLES]
        if len(chunk) < OPUS_PACKET_SAMPLES:
            chunk = np.concatenate([chunk, np.zeros(OPUS_PACKET_SAMPLES - len(chunk), np.int16)])
        frame = AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = MEDIA_SAMPLE_RATE_HZ
        frame.pts = index * OPUS_PACKET_SAMPLES
        frame.time_base = TIME_BASE
        self.sent_at.append(time.monotonic())
        if self.finished:
            self.done.set()
        return frame


@dataclass
class ReceivedVideo:
    """Arrival time, RTP-derived pts (90 kHz) and the mouth region's pixels (RGB) of every frame."""

    arrived_at: list[float] = field(default_factory=list)
    pts: list[int] = field(default_factory=list)
    regions: list[npt.NDArray[np.uint8]] = field(default_factory=list)
    size: tuple[int, int] | None = None
    first_frame: npt.NDArray[np.uint8] | None = None
    keyframes_at: list[float] = field(default_factory=list)  # when the receiver released a keyframe
    # When the probe's receiver gave up on a missing packet and asked for a keyframe (PLI): the picture is
    # broken from the last frame before until the next keyframe.
    give_ups: list[float] = field(default_factory=list)
    lost_keyframe_at: list[float] = field(default_factory=list)  # a keyframe the probe lost on purpose
    # aiortc's receiver counts pts from the first frame it *released*; when the stream's first frames never
    # decoded (lost at the start of a narrow link), this many 90 kHz ticks lie before that frame
    # (:func:`first_frame_offset`).
    pts_offset: int = 0


@dataclass
class ReceivedAudio:
    """Decoded audio as 48 kHz mono int16, and the arrival time of each decoded chunk's first sample."""

    chunks: list[npt.NDArray[np.int16]] = field(default_factory=list)
    arrived_at: list[float] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    total: int = 0

    def samples(self) -> npt.NDArray[np.int16]:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int16)


REGION_ONLY_FROM_PX = 640 * 360  # smaller frames are converted whole, with swscale, as before


def region_rgb(frame: VideoFrame, x1: int, y1: int, x2: int, y2: int) -> npt.NDArray[np.uint8]:
    """The RGB pixels of ``frame`` in [x1, x2) x [y1, y2): a decoded yuv420p frame's region alone is
    converted (a 1280x720 frame whole costs the probe 2-3 ms, which 40 calls on a few cores cannot pay)."""
    if frame.format.name != "yuv420p" or frame.width * frame.height < REGION_ONLY_FROM_PX:
        return cast(npt.NDArray[np.uint8], frame.to_ndarray(format="rgb24"))[y1:y2, x1:x2].copy()
    ex1, ey1 = x1 // 2 * 2, y1 // 2 * 2
    ex2, ey2 = min(frame.width, -(-x2 // 2) * 2), min(frame.height, -(-y2 // 2) * 2)
    luma, cb, cr = (np.frombuffer(cast(Any, p), np.uint8) for p in frame.planes)
    strides = [p.line_size for p in frame.planes]
    y = luma.reshape(-1, strides[0])[ey1:ey2, ex1:ex2]
    u = cb.reshape(-1, strides[1])[ey1 // 2 : ey2 // 2, ex1 // 2 : ex2 // 2]
    v = cr.reshape(-1, strides[2])[ey1 // 2 : ey2 // 2, ex1 // 2 : ex2 // 2]
    h, w = y.shape
    i420 = np.concatenate([y.reshape(-1), u.reshape(-1), v.reshape(-1)]).reshape(h * 3 // 2, w)
    rgb = cast(npt.NDArray[np.uint8], cv2.cvtColor(i420, cv2.COLOR_YUV2RGB_I420))
    return np.ascontiguousarray(rgb[y1 - ey1 : y1 - ey1 + (y2 - y1), x1 - ex1 : x1 - ex1 + (x2 - x1)])


async def record_video(
    track: MediaStreamTrack, out: ReceivedVideo, region: tuple[int, int, int, int] | None
) -> None:
    """Record until the track ends. ``region`` = (x1, y1, x2, y2) of the pixels to keep."""
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        assert isinstance(frame, VideoFrame)
        now = time.monotonic()
        if out.size is not None and (frame.width, frame.height) != out.size:
            # The server stepped the size down for a narrow link: compared at the call's own size.
            frame = frame.reformat(width=out.size[0], height=out.size[1])
        if out.first_frame is None:
            out.first_frame = cast(npt.NDArray[np.uint8], frame.to_ndarray(format="rgb24"))
            out.size = (frame.width, frame.height)
        x1, y1, x2, y2 = region or (0, 0, frame.width, frame.height)
        out.arrived_at.append(now)
        out.pts.append(int(frame.pts or 0))
        out.regions.append(region_rgb(frame, x1, y1, x2, y2))


async def record_audio(track: MediaStreamTrack, out: ReceivedAudio) -> None:
    resampler = AudioResampler(format="s16", layout="mono", rate=MEDIA_SAMPLE_RATE_HZ)
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        now = time.monotonic()
        assert isinstance(frame, AudioFrame)
        for converted in resampler.resample(frame):
            samples = converted.to_ndarray().reshape(-1).astype(np.int16, copy=False)
            out.chunks.append(samples)
            out.arrived_at.append(now)
            out.starts.append(out.total)
            out.total += len(samples)
