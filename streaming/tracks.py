"""The two outgoing tracks. They only pace and convert: tick ``k`` leaves at the stream's presentation time.

Video may skip or repeat a frame; audio never skips: every tick's audio leaves, in order, so the audio RTP
clock (counted in samples by the Opus encoder) and the video RTP clock (from the tick index) advance together.
"""

from __future__ import annotations

import fractions
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ
from lipcast.streaming.avatar_stream import AvatarStream
from lipcast.streaming.frames import ComposedFrame
from lipcast.streaming.sizes import OutputSize
from lipcast.streaming.tick import Tick
from lipcast.streaming.wire import FrameMeta

logger = logging.getLogger(__name__)

AUDIO_TIME_BASE = fractions.Fraction(1, MEDIA_SAMPLE_RATE_HZ)


def stereo_audio_frame(samples: npt.NDArray[np.int16], pts: int) -> AudioFrame:
    """48 kHz mono samples as the s16 stereo frame the outbound audio track sends, starting at ``pts``.

    Both channels are equal: aiortc's Opus encoder upmixes mono at -3 dB, and the caller's voice should come
    back at the level it went in.
    """
    frame = AudioFrame.from_ndarray(np.repeat(samples, 2).reshape(1, -1), format="s16", layout="stereo")
    frame.sample_rate = MEDIA_SAMPLE_RATE_HZ
    frame.pts = pts
    frame.time_base = AUDIO_TIME_BASE
    return frame


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
    """Paces the stream's composed frames (:mod:`lipcast.streaming.frames`): every video track of one stream
    gets the same picture for a tick, composed once (``recv`` wraps it in a VideoFrame of this track's
    own)."""

    kind = "video"

    def __init__(
        self,
        stream: AvatarStream,
        on_frame: Callable[[FrameMeta], None] | None = None,
        *,
        size: OutputSize | None = None,
    ) -> None:
        """``size``: the pictures' output size (None: the avatar's own)."""
        super().__init__()
        self.stream = stream
        self.on_frame = on_frame
        self.size = size
        self.stats = VideoStats()
        self._next = 0

    def start_at(self, index: int) -> None:
        """Join a running stream at tick ``index`` instead of tick 0 (a viewer arriving late)."""
        self._next = index

    async def recv(self) -> VideoFrame:
        return (await self.next_frame(planes=True)).video_frame(size=self.size)

    async def next_frame(self, *, planes: bool = False) -> ComposedFrame:
        """The next tick's composed frame at its presentation time (shared with the stream's consumers);
        ``planes``: its yuv420p planes at this track's size made now (counted in the frame's "compose"
        stage)."""
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
        frame = stream.frames.compose(tick)
        compose_ms = frame.compose_ms  # the tick's decision, once for every consumer ...
        if planes:
            frame.yuv420p(self.size)  # ... and its picture at this size, made once for all consumers of it
            compose_ms += frame.content.planes_ms(self.size or frame.size)
        self.stats.sent += 1
        self.stats.late += int(frame.late)
        self.stats.failed += int(frame.failed)
        if self.on_frame is not None:
            self.on_frame(self._meta(tick, frame, compose_ms))
        return frame

    def _meta(self, tick: Tick, frame: ComposedFrame, compose_ms: float) -> FrameMeta:
        stream = self.stream
        # Where a frame's time goes on the server (ms): its audio waits in the jitter buffer ("buffer", the
        # newest audio pulled at this tick), then the fixed lookahead delay ("lookahead"), the tick is
        # produced ("produce_late" after its due time), rendered ("render": queue + engine) within the
        # render budget ("budget": due -> leaves), and composed ("compose") before the encoder.
        stages = {
            "features": round(tick.featurize_ms, 3),
            "compose": round(compose_ms, 3),
            "lookahead": round(stream.delay_ms, 3),
            "budget": round(stream.render_budget_s * 1000.0, 3),
            "produce_late": round(tick.late_ms, 3),
        }
        if tick.render_ms is not None:
            stages["render"] = round(tick.render_ms, 3)
        if tick.buffer_ms is not None:
            stages["buffer"] = round(tick.buffer_ms, 3)
        return FrameMeta(
            frame=tick.index,
            avatar_frame=tick.frame_index,
            input_pos_ms=(None if tick.input_pos is None else tick.input_pos * 1000.0 / MEDIA_SAMPLE_RATE_HZ),
            speech=tick.speech,
            active=tick.patch is not None,
            mouth=[round(float(v), 4) for v in tick.conditioning.reshape(-1)[:3]],
            late=frame.late,
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
        frame = stereo_audio_frame(samples, self._next * size)
        self._next += 1
        self.sent += 1
        return frame
