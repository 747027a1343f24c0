"""Encode once, send to many: one video encoder per (output size, codec: VP8 or H.264) and one Opus encoder
per session feed every viewer of that session who watches at that size in that codec.

aiortc encodes per peer connection: N viewers of one track would mean N VP8 encodes of the same pictures. But
an ``RTCRtpSender`` also accepts an ``av.Packet`` from its track's ``recv()`` and then only packetizes it
(``Encoder.pack``: the VP8 payload descriptor with the sender's own picture id, or the Opus packet as it is),
then adds its own SSRC, sequence numbers, timestamp origin, SRTP, NACK history and RTCP. So the fan-out
encodes each tick once and hands the same packets to every viewer's :class:`PacketTrack`; each viewer's
sender does the cheap per-connection part.

What the shared encoder changes:

- **Keyframes.** A viewer can only start decoding at a keyframe. A new subscription drops packets until one
  arrives and asks for one; a viewer's PLI/FIR (aiortc calls ``RTCRtpSender._send_keyframe``) is routed to
  the shared encoder too (see :func:`route_keyframe_requests`). Forced keyframes are spaced at least
  ``KEYFRAME_MIN_INTERVAL_S`` apart so one lossy viewer cannot turn every frame into a keyframe for all.
- **Bitrate: the slowest viewer.** aiortc steers each caller's encoder by its receiver's REMB; a shared
  encoder serves every viewer of its (size, codec), so it follows the *lowest* estimate among them
  (:func:`lipcast.streaming.rtc.video_estimate_bps`, re-read once a second, moved when it differs by more
  than 10 %), within ``MIN_BITRATE_BPS`` and its configured target (``video_bitrate_bps``, chosen for
  LAN/localhost viewers such as OBS). A viewer that sends no estimate (OBS's WHEP client does not) counts
  as fast. One viewer on a narrow link thus lowers the picture of the others of its tier; splitting tiers by
  estimate would cost one more encode per tier, and the viewers of a session are mostly one OBS or a few
  browsers on one LAN.
- **Slow viewers.** Each viewer has a bounded queue. Video that overflows is dropped up to the next keyframe
  (a partial GOP cannot be decoded); audio that overflows loses its oldest packets. Neither ever blocks the
  encoder or the other viewers.

The sources are the session's own paced tracks (:class:`AvatarVideoTrack`, :class:`AvatarAudioTrack`), so
viewers get exactly the ticks the caller gets, at the same presentation times, and the very frames the caller
gets (composed once per tick, :mod:`lipcast.streaming.frames`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import av
from aiortc import RTCRtpSender
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame
from av.packet import Packet

from lipcast.pipeline.timing import FPS, MEDIA_SAMPLE_RATE_HZ
from lipcast.streaming.avatar_stream import AvatarStream
from lipcast.streaming.encoders import MIN_BITRATE_BPS, H264Settings, Vp8Settings, open_h264, open_vp8
from lipcast.streaming.sizes import OutputSize
from lipcast.streaming.tasks import cancel_and_wait, session_log
from lipcast.streaming.tracks import AvatarAudioTrack, AvatarVideoTrack
from lipcast.streaming.wire import FrameMeta

logger = logging.getLogger(__name__)

DEFAULT_VIDEO_BITRATE_BPS = 1_500_000  # aiortc's REMB ceiling: what the caller gets on a good network
OPUS_BITRATE_BPS = 96_000  # as aiortc's own Opus encoder
OPUS_TIME_BASE = fractions.Fraction(1, MEDIA_SAMPLE_RATE_HZ)
KEYFRAME_MIN_INTERVAL_S = 0.5
RATE_CHECK_INTERVAL_S = 1.0  # how often the shared encoder looks at its viewers' estimates
VIDEO_QUEUE_FRAMES = FPS  # 1 s
AUDIO_QUEUE_PACKETS = 50  # 1 s of 20 ms packets


def scaled_bitrate_bps(bitrate_bps: int, size: OutputSize) -> int:
    """A viewer encoder's target at ``size``: ``bitrate_bps`` (the setting, for up to 320x320) scaled with
    the pixels beyond that (as the callers' ceiling, :func:`lipcast.streaming.encoders.max_bitrate_bps`)."""
    return max(bitrate_bps, round(bitrate_bps * size.pixels / (320 * 320) * 0.25))


class Vp8PacketEncoder:
    """VP8 with the caller's encoder's settings (:mod:`lipcast.streaming.encoders`), returning whole frames as
    ``av.Packet`` (not RTP payloads)."""

    def __init__(
        self, bitrate_bps: int = DEFAULT_VIDEO_BITRATE_BPS, settings: Vp8Settings | None = None
    ) -> None:
        self.bitrate_bps = bitrate_bps
        self.settings = settings or Vp8Settings()
        self.codec: Any = None  # av.VideoCodecContext, opened on the first frame (its size)
        self._target_bps: int | None = None  # below bitrate_bps while a viewer's estimate is lower

    def _open(self, width: int, height: int) -> Any:
        return open_vp8(width, height, self.target_bps, self.settings)

    @property
    def target_bps(self) -> int:
        """What the codec encodes at: the configured bitrate, or less while a viewer's link asks for less."""
        return self._target_bps if self._target_bps is not None else self.bitrate_bps

    def follow(self, lowest_estimate_bps: int | None) -> None:
        """The lowest of the viewers' estimates (None: none sent one): the codec reopens (a keyframe) when
        the target moves by more than 10 %."""
        target = self.bitrate_bps
        if lowest_estimate_bps is not None:
            target = max(MIN_BITRATE_BPS, min(self.bitrate_bps, lowest_estimate_bps))
        if abs(target - self.target_bps) > 0.1 * self.target_bps:
            self._target_bps = target
            self.codec = None  # reopened at the next frame

    def encode(self, frame: VideoFrame, keyframe: bool = False) -> tuple[Packet | None, bool]:
        """One frame in, (its packet or None if the encoder produced nothing, whether it is a keyframe)."""
        if self.codec is None or (frame.width, frame.height) != (self.codec.width, self.codec.height):
            self.codec = self._open(frame.width, frame.height)
        pts, time_base = frame.pts, frame.time_base
        # Write only to a frame of our own: an rgb24 input's conversion is one (its picture type set here, not
        # copied from the input); a yuv420p input, as the session's frames are, is copied only for a keyframe.
        if frame.format.name != "yuv420p" or keyframe:
            if frame.format.name != "yuv420p":
                frame = frame.reformat(format="yuv420p")
            else:
                frame = VideoFrame.from_ndarray(frame.to_ndarray(), format="yuv420p")
            frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        packets = self.codec.encode(frame)
        if not packets:
            return None, False
        out = Packet(b"".join(bytes(p) for p in packets))
        out.pts = pts
        if time_base is not None:
            out.time_base = time_base
        return out, any(p.is_keyframe for p in packets)


class H264PacketEncoder(Vp8PacketEncoder):
    """H.264 with the callers' encoder's settings (:func:`lipcast.streaming.encoders.open_h264`), whole
    frames as ``av.Packet`` (Annex B; each viewer's sender packetizes them)."""

    def __init__(
        self, bitrate_bps: int = DEFAULT_VIDEO_BITRATE_BPS, settings: H264Settings | None = None
    ) -> None:
        super().__init__(bitrate_bps)
        self.h264 = settings or H264Settings()

    def _open(self, width: int, height: int) -> Any:
        return open_h264(width, height, self.target_bps, self.h264)


class OpusPacketEncoder:
    """Opus as aiortc's encoder sets it up; the input is the audio track's 20 ms stereo s16 frames."""

    def __init__(self) -> None:
        codec: Any = av.CodecContext.create("libopus", "w")
        codec.bit_rate = OPUS_BITRATE_BPS
        codec.format = "s16"
        codec.layout = "stereo"
        codec.sample_rate = MEDIA_SAMPLE_RATE_HZ
        codec.time_base = OPUS_TIME_BASE
        codec.options = {"application": "voip"}
        self.codec = codec
        self._offset: int | None = None  # libopus starts its pts below zero; packets carry the input's

    def encode(self, frame: AudioFrame) -> list[Packet]:
        packets = list(self.codec.encode(frame))
        for packet in packets:
            if self._offset is None:
                self._offset = int(frame.pts or 0) - int(packet.pts or 0)
            packet.pts = int(packet.pts or 0) + self._offset
            packet.time_base = OPUS_TIME_BASE
        return packets


@dataclass
class FanoutStats:
    video_frames: int = 0
    keyframes: int = 0
    forced_keyframes: int = 0
    audio_packets: int = 0
    video_encode_ms: float = 0.0  # total
    video_target_bps: int = 0  # what the shared video encoder aims at now (its viewers' lowest estimate)


class PacketTrack(MediaStreamTrack):
    """One viewer's track: returns the shared encoder's packets, in order, from a bounded queue."""

    def __init__(
        self,
        kind: str,
        capacity: int,
        on_packet: Callable[[FrameMeta | None], None] | None = None,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.capacity = capacity
        self.on_packet = on_packet
        self.waiting_for_keyframe = kind == "video"
        self.delivered = 0
        self.dropped = 0
        self._queue: deque[tuple[Packet, FrameMeta | None]] = deque()
        self._ready = asyncio.Event()

    def offer(self, packet: Packet, keyframe: bool = False, meta: FrameMeta | None = None) -> bool:
        """Queue a packet; False when this (video) track needs a keyframe before it can go on."""
        if self.readyState != "live":
            return True
        if self.waiting_for_keyframe:
            if not keyframe:
                return False
            self.waiting_for_keyframe = False
        if len(self._queue) >= self.capacity:
            if self.kind == "video":
                # The viewer fell a second behind: what is queued is useless without what was dropped.
                self.dropped += len(self._queue) + 1
                self._queue.clear()
                self.waiting_for_keyframe = True
                return False
            self._queue.popleft()
            self.dropped += 1
        self._queue.append((packet, meta))
        self._ready.set()
        return True

    async def recv(self) -> Packet:
        while not self._queue:
            if self.readyState != "live":
                raise MediaStreamError
            self._ready.clear()
            await self._ready.wait()
        packet, meta = self._queue.popleft()
        self.delivered += 1
        if self.on_packet is not None:
            self.on_packet(meta)
        return packet

    def stop(self) -> None:
        super().stop()
        self._ready.set()  # wake a waiting recv() so it raises


@dataclass
class Subscription:
    video: PacketTrack
    audio: PacketTrack
    # The viewer's receiver estimate for its video (bits per second; None: none yet), once its sender exists.
    estimate_bps: Callable[[], int | None] | None = None

    def stop(self) -> None:
        self.video.stop()
        self.audio.stop()


def route_keyframe_requests(sender: RTCRtpSender, request: Callable[[], None]) -> bool:
    """Make a viewer's PLI/FIR ask the shared encoder for a keyframe.

    aiortc answers PLI/FIR by calling the sender's ``_send_keyframe()``, which only flags its own encoder; a
    sender that packs pre-encoded packets has none to flag. This replaces the method on that one sender
    object. If a future aiortc renames it, viewers still get a keyframe on joining and when they overflow.
    """
    if not callable(getattr(sender, "_send_keyframe", None)):
        logger.warning("aiortc internals changed: viewer keyframe requests are not forwarded")
        return False
    setattr(sender, "_send_keyframe", request)  # noqa: B010 (mypy forbids assigning to a method)
    return True


class EncodedFanout:
    """A session's shared encoders and the viewers' subscriptions. ``start()`` once, ``stop()`` to end."""

    def __init__(
        self,
        stream: AvatarStream,
        *,
        video_bitrate_bps: int = DEFAULT_VIDEO_BITRATE_BPS,
        vp8: Vp8Settings | None = None,
        h264: H264Settings | None = None,
        size: OutputSize | None = None,
        codec: str = "vp8",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``size``: the video's (None: the avatar's own); ``codec``: vp8 or h264."""
        self.stream = stream
        self.stats = FanoutStats()
        self.codec = codec
        self.size = size
        self._video_encoder = (
            H264PacketEncoder(video_bitrate_bps, h264)
            if codec == "h264"
            else Vp8PacketEncoder(video_bitrate_bps, vp8)
        )
        self._audio_encoder = OpusPacketEncoder()
        self._video_source = AvatarVideoTrack(stream, on_frame=self._on_frame, size=size)
        self._audio_source = AvatarAudioTrack(stream)
        self._subscriptions: list[Subscription] = []
        self._meta: FrameMeta | None = None
        self._start_index: int | None = None
        self._keyframe_wanted = True
        self._last_forced_s = float("-inf")
        self._rate_checked_s = float("-inf")
        self._monotonic = monotonic
        self._tasks: list[asyncio.Task[None]] = []
        self.exited = asyncio.Event()
        self.on_failure: Callable[[Exception], None] | None = None  # told once, after the viewers' tracks end
        self.failed = False
        self.log = session_log(logger, stream.session_id)

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)

    def subscribe(self, on_video_packet: Callable[[FrameMeta | None], None] | None = None) -> Subscription:
        subscription = Subscription(
            PacketTrack("video", VIDEO_QUEUE_FRAMES, on_video_packet),
            PacketTrack("audio", AUDIO_QUEUE_PACKETS),
        )
        self._subscriptions.append(subscription)
        self.request_keyframe()
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        subscription.stop()
        with contextlib.suppress(ValueError):
            self._subscriptions.remove(subscription)

    def request_keyframe(self) -> None:
        self._keyframe_wanted = True

    def start(self) -> None:
        if self._tasks:
            return
        name = self.stream.session_id
        self._tasks = [
            asyncio.create_task(self._run_video(), name=f"fanout-video-{name}"),
            asyncio.create_task(self._run_audio(), name=f"fanout-audio-{name}"),
        ]

    async def stop(self) -> None:
        self._video_source.stop()
        self._audio_source.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            await cancel_and_wait(task)
        self._tasks = []
        for subscription in self._subscriptions:
            subscription.stop()
        self._subscriptions.clear()
        self.exited.set()

    def _on_frame(self, meta: FrameMeta) -> None:
        self._meta = meta

    async def _join(self) -> bool:
        """Wait for the stream, then start both sources at one tick, the next to leave; False if it closed."""
        stream = self.stream
        await stream.started.wait()
        if stream.closed or stream.timeline is None:
            return False
        if self._start_index is None:  # the first of the two tasks here picks the tick for both
            newest = stream.timeline.index_at(stream.clock.now() - stream.render_budget_s)
            self._start_index = max(0, newest + 1)
            self._video_source.start_at(self._start_index)
            self._audio_source.start_at(self._start_index)
        return True

    def _follow_viewers(self) -> None:
        """Once a second: the shared encoder moves to the lowest estimate among its viewers."""
        now = self._monotonic()
        if now - self._rate_checked_s < RATE_CHECK_INTERVAL_S:
            return
        self._rate_checked_s = now
        estimates = [s.estimate_bps() for s in self._subscriptions if s.estimate_bps is not None]
        known = [e for e in estimates if e is not None]
        self._video_encoder.follow(min(known) if known else None)
        self.stats.video_target_bps = self._video_encoder.target_bps

    def _take_keyframe_request(self) -> bool:
        if not self._keyframe_wanted:
            return False
        now = self._monotonic()
        if now - self._last_forced_s < KEYFRAME_MIN_INTERVAL_S:
            return False
        self._keyframe_wanted = False
        self._last_forced_s = now
        return True

    async def _run_video(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if not await self._join():
                return
            while True:
                frame = await self._video_source.recv()
                meta, self._meta = self._meta, None
                force = self._take_keyframe_request()
                self._follow_viewers()
                started = time.perf_counter()
                # Off the event loop, like aiortc's own encodes (a 320x320 VP8 frame: ~1-3 ms on one core).
                packet, keyframe = await loop.run_in_executor(None, self._video_encoder.encode, frame, force)
                self.stats.video_encode_ms += (time.perf_counter() - started) * 1000.0
                if packet is None:
                    continue
                self.stats.video_frames += 1
                self.stats.keyframes += int(keyframe)
                self.stats.forced_keyframes += int(force)
                for subscription in list(self._subscriptions):
                    if not subscription.video.offer(packet, keyframe, meta):
                        self.request_keyframe()
        except MediaStreamError:
            pass  # the session's stream ended, or stop()
        except Exception as e:
            self.log.exception("viewer video encoder failed")
            self._fail(e)

    async def _run_audio(self) -> None:
        try:
            if not await self._join():
                return
            while True:
                frame = await self._audio_source.recv()
                # 20 ms of Opus takes ~0.1 ms: on the loop, no thread hop per packet.
                for packet in self._audio_encoder.encode(frame):
                    self.stats.audio_packets += 1
                    for subscription in list(self._subscriptions):
                        subscription.audio.offer(packet)
        except MediaStreamError:
            pass
        except Exception as e:
            self.log.exception("viewer audio encoder failed")
            self._fail(e)

    def _fail(self, error: Exception) -> None:
        """An encoder failed: end every viewer's tracks (they see end of stream) and tell the owner, once."""
        for subscription in self._subscriptions:
            subscription.stop()
        if not self.failed:
            self.failed = True
            if self.on_failure is not None:
                self.on_failure(error)
