"""Inbound: the caller's audio track -> 48 kHz mono int16 -> voice activity -> the session's audio buffer.

aiortc hands out decoded Opus as 48 kHz stereo s16; PyAV's ``AudioResampler`` makes it mono (and handles any
other format or rate a track might produce). The 48 kHz stream is what the avatar speaks back; the feature
path decimates it to 16 kHz on the media clock (:mod:`lipcast.streaming.resample`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, AudioResampler

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ
from lipcast.streaming.audio_buffer import InputAudioBuffer
from lipcast.streaming.tasks import cancel_and_wait, session_log
from lipcast.streaming.vad import Reblocker, SpeechDetector

logger = logging.getLogger(__name__)


class AudioIngest:
    """Reads one remote audio track until it ends; owns its task."""

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

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"ingest-{self.session_id}")

    async def stop(self) -> None:
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
