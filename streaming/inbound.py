"""Inbound: the caller's audio -> 48 kHz mono int16 -> voice activity -> the session's audio buffer.

The caller's Opus packets are taken from aiortc's receiver before its own jitter buffer
(:meth:`AudioIngest.attach` puts a :class:`PlayoutTap` in its place): :mod:`lipcast.streaming.playout`
orders them, waits for a missing one only as long as the jitter estimate says, conceals what is lost
(:mod:`lipcast.streaming.opus`: libopus's FEC and PLC) and decodes to 48 kHz mono. Where the tap cannot be
put in (a future aiortc renamed what it replaces), aiortc decodes as before and :meth:`AudioIngest.convert`
takes its frames: 48 kHz stereo s16 made mono by PyAV's ``AudioResampler``. The 48 kHz stream is what the
avatar speaks back; the feature path decimates it to 16 kHz on the media clock
(:mod:`lipcast.streaming.resample`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from aiortc import RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, AudioResampler

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ
from lipcast.streaming.audio_buffer import InputAudioBuffer
from lipcast.streaming.opus import OpusDecoder
from lipcast.streaming.playout import PacketPlayout, Released
from lipcast.streaming.rtc import JITTER_BUFFER_ATTRIBUTE
from lipcast.streaming.tasks import cancel_and_wait, session_log
from lipcast.streaming.vad import Reblocker, SpeechDetector

logger = logging.getLogger(__name__)


class PlayoutTap:
    """Stands in for an aiortc audio receiver's jitter buffer: every packet goes to a :class:`PacketPlayout`
    (aiortc decodes nothing), and a timer releases what the playout gives up waiting for."""

    def __init__(
        self, playout: PacketPlayout, on_audio: Callable[[Released], None], clock: Callable[[], float]
    ):
        self.playout = playout
        self.on_audio = on_audio
        self.clock = clock
        self._timer: asyncio.TimerHandle | None = None

    def add(self, packet: Any) -> tuple[bool, None]:
        """aiortc's ``JitterBuffer.add``: the packet (its Opus payload in ``_data``); no frame comes back."""
        payload = getattr(packet, "_data", packet.payload)
        self._emit(self.playout.push(packet.sequence_number, packet.timestamp, payload, self.clock()))
        return False, None

    def _emit(self, released: list[Released]) -> None:
        for item in released:
            self.on_audio(item)
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.playout.deadline_s()
        if deadline is not None:
            delay_s = max(0.0, deadline - self.clock())
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        self._emit(self.playout.release(self.clock()))

    def refill(self, short_samples: int) -> None:
        """The buffer is this short of a tick: conceal now rather than let it run dry."""
        self._emit(self.playout.release(self.clock(), need_samples=short_samples))

    def stretch(self, samples: int) -> npt.NDArray[np.int16]:
        """Concealment that holds the stream back (the buffer deepens after late audio)."""
        return self.playout.stretch(samples)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class AudioIngest:
    """Takes one remote audio track's audio until it ends; owns its task."""

    def __init__(
        self,
        track: MediaStreamTrack,
        buffer: InputAudioBuffer,
        detector: SpeechDetector,
        *,
        session_id: str = "-",
        on_failure: Callable[[Exception], None] | None = None,
    ) -> None:
        if buffer.sample_rate_hz != MEDIA_SAMPLE_RATE_HZ or detector.sample_rate_hz != MEDIA_SAMPLE_RATE_HZ:
            raise ValueError("the inbound buffer and detector must run at 48 kHz")
        self.track = track
        self.buffer = buffer
        self.detector = detector
        self.session_id = session_id
        self.on_failure = on_failure  # told once if reading or converting fails (not when the track ends)
        self.log = session_log(logger, session_id)
        self.frames_received = 0
        self.speech = False
        self._resampler = AudioResampler(format="s16", layout="mono", rate=MEDIA_SAMPLE_RATE_HZ)
        self._reblocker = Reblocker(detector.block_samples)
        self._task: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()
        self.playout: PacketPlayout | None = None  # set once attached to the receiver's packets
        self._origin: int | None = None  # the RTP timestamp at stream position 0
        self._tap: PlayoutTap | None = None

    def attach(self, receiver: RTCRtpReceiver) -> bool:
        """Take the track's packets from ``receiver`` (see the module doc). Returns whether it could."""
        if not hasattr(receiver, JITTER_BUFFER_ATTRIBUTE):
            self.log.warning("aiortc internals changed: inbound audio decoded by aiortc, no concealment")
            return False
        buffer = self.buffer
        jitter = buffer.jitter
        self.playout = PacketPlayout(
            OpusDecoder(),
            wait_ms_for=(lambda: jitter.jitter_ms) if jitter is not None else lambda: 20.0,
            on_late=self._late,
            on_fec_missed=buffer.observe_fec_missed,
        )
        self._tap = PlayoutTap(self.playout, self.accept, buffer.clock)
        setattr(receiver, JITTER_BUFFER_ATTRIBUTE, self._tap)
        buffer.refill = self._tap.refill
        buffer.stretch = self._tap.stretch
        return True

    def _late(self, timestamp: int, arrived_s: float) -> None:
        if self._origin is None:
            return
        position = (timestamp - self._origin) % (1 << 32)
        if position < 1 << 31:  # not from before the first packet played (a reordered start)
            self.buffer.observe_late(arrived_s, position)

    def accept(self, audio: Released) -> None:
        """Audio from the playout, in stream order: whole 20 ms blocks to the buffer, with speech flags."""
        self.frames_received += audio.arrived_s is not None
        if self._origin is None and audio.timestamp is not None:
            # RTP timestamp -> stream position: concealment keeps the two a constant offset apart
            self._origin = audio.timestamp - self.buffer.stream_position - self._reblocker.pending
        for block in self._reblocker.feed(audio.samples):
            self.speech = self.detector.is_speech(block)
            self.buffer.push(block, self.speech, arrived_s=audio.arrived_s, concealed=audio.arrived_s is None)

    def receive_counters(self) -> dict[str, float]:
        """What the packet stage did so far, and the buffer's target (for the meta channel and /metrics)."""
        out: dict[str, float] = {"target_ms": round(self.buffer.target_ms, 1)}
        if self.playout is not None:
            stats = self.playout.stats
            out |= {
                "lost": stats.lost,
                "concealed_ms": round(stats.concealed_samples * 1000.0 / MEDIA_SAMPLE_RATE_HZ, 1),
                "fec": stats.fec_recovered,
                "fec_missed": stats.fec_missed,
                "late": stats.late,
                "reordered": stats.reordered,
                "stretched_ms": round(stats.stretched_samples * 1000.0 / MEDIA_SAMPLE_RATE_HZ, 1),
            }
        return out

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"ingest-{self.session_id}")

    async def stop(self) -> None:
        if self._tap is not None:
            self._tap.close()
        await cancel_and_wait(self._task)
        self._task = None

    def convert(self, frame: AudioFrame) -> None:
        """Resample one decoded frame and push whole 20 ms blocks with their speech flags."""
        for out in self._resampler.resample(frame):
            samples = out.to_ndarray().reshape(-1).astype(np.int16, copy=False)
            for block in self._reblocker.feed(samples):
                self.speech = self.detector.is_speech(block)
                self.buffer.push(block, self.speech)

    async def _run(self) -> None:
        error: Exception | None = None
        try:
            while True:
                try:
                    frame = await self.track.recv()
                except MediaStreamError:
                    self.log.info("inbound audio ended")
                    return
                if not isinstance(frame, AudioFrame):
                    continue
                self.frames_received += 1
                self.convert(frame)
        except Exception as e:
            error = e
            self.log.exception("inbound audio failed")
        finally:
            self.ended.set()
        if error is not None and self.on_failure is not None:
            self.on_failure(error)
