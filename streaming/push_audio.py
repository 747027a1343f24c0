"""Pushed audio: PCM16 mono bytes from a program (a TTS) -> 48 kHz -> voice activity -> the session's buffer.

The bytes come in messages of any length; an odd trailing byte waits for the next message. PyAV's
``AudioResampler`` converts the input rate to 48 kHz. The buffer is bounded in seconds: a message that would
take it past the bound is refused as a whole (:class:`PushBufferFull`), nothing of it is queued and nothing
already queued is dropped, so the sender can wait and send it again.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from av import AudioFrame, AudioResampler

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ
from lipcast.streaming.audio_buffer import InputAudioBuffer
from lipcast.streaming.vad import Reblocker, SpeechDetector

MIN_INPUT_RATE_HZ = 8_000
MAX_INPUT_RATE_HZ = MEDIA_SAMPLE_RATE_HZ  # the media rate: pushed audio is never upsampled past what leaves


class PushBufferFull(Exception):
    """The message would take the queued audio past the bound; it was not queued."""


class PushAudio:
    """Converts one push session's input stream and queues it for playout."""

    def __init__(
        self,
        buffer: InputAudioBuffer,
        detector: SpeechDetector,
        *,
        input_rate_hz: int,
        max_buffer_s: float,
        tick_samples: int,
    ) -> None:
        if not MIN_INPUT_RATE_HZ <= input_rate_hz <= MAX_INPUT_RATE_HZ:
            raise ValueError(f"input rate must be {MIN_INPUT_RATE_HZ}-{MAX_INPUT_RATE_HZ} Hz")
        if buffer.sample_rate_hz != MEDIA_SAMPLE_RATE_HZ or detector.sample_rate_hz != MEDIA_SAMPLE_RATE_HZ:
            raise ValueError("the push buffer and detector must run at 48 kHz")
        self.buffer = buffer
        self.detector = detector
        self.input_rate_hz = input_rate_hz
        self.max_buffer_samples = round(max_buffer_s * MEDIA_SAMPLE_RATE_HZ)
        self.tick_samples = tick_samples
        self.received_bytes = 0
        self.refused_bytes = 0
        self._odd = b""
        self._pts = 0
        self._resampler = self._new_resampler()
        self._reblocker = Reblocker(detector.block_samples)

    def _new_resampler(self) -> AudioResampler:
        return AudioResampler(format="s16", layout="mono", rate=MEDIA_SAMPLE_RATE_HZ)

    @property
    def queued_s(self) -> float:
        return self.buffer.depth_samples / MEDIA_SAMPLE_RATE_HZ

    def push(self, data: bytes) -> int:
        """Queue one message of PCM16 little-endian mono bytes; returns the 48 kHz samples queued.

        Raises :class:`PushBufferFull` (queuing nothing) when it would not fit.
        """
        data = self._odd + data
        whole = len(data) - len(data) % 2
        incoming_48k = (whole // 2) * MEDIA_SAMPLE_RATE_HZ // self.input_rate_hz
        if self.buffer.depth_samples + incoming_48k > self.max_buffer_samples:
            self.refused_bytes += len(data) - len(self._odd)
            raise PushBufferFull(
                f"push buffer full: {self.queued_s:.1f} s queued, this message adds "
                f"{incoming_48k / MEDIA_SAMPLE_RATE_HZ:.2f} s over the"
                f" {self.max_buffer_samples / MEDIA_SAMPLE_RATE_HZ:g} s bound;"
                " nothing of it was queued, send it again later"
            )
        self.received_bytes += len(data) - len(self._odd)
        self._odd = data[whole:]
        if whole == 0:
            return 0
        samples = np.frombuffer(data[:whole], dtype="<i2").astype(np.int16)
        frame = AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.input_rate_hz
        frame.pts = self._pts
        self._pts += len(samples)
        return self._queue(self._resampler.resample(frame))

    def end_of_speech(self) -> int:
        """Flush: the resampler's tail and the partial block, padded with silence to whole ticks."""
        queued = self._queue(self._resampler.resample(None))
        self._resampler = self._new_resampler()
        self._pts = 0
        self._odd = b""
        tail = self._reblocker.take_rest()
        if len(tail):
            padded = np.zeros(self._reblocker.block_samples, np.int16)
            padded[: len(tail)] = tail
            self._push_block(padded)
            queued += len(padded)
        return queued + self.buffer.flush(self.tick_samples)

    def interrupt(self) -> None:
        """Forget what is still being converted (the buffer itself is emptied by the stream's interrupt)."""
        self._resampler = self._new_resampler()
        self._pts = 0
        self._odd = b""
        self._reblocker.take_rest()

    def _queue(self, frames: list[AudioFrame]) -> int:
        queued = 0
        for out in frames:
            samples: npt.NDArray[np.int16] = out.to_ndarray().reshape(-1).astype(np.int16, copy=False)
            for block in self._reblocker.feed(samples):
                self._push_block(block)
                queued += len(block)
        return queued

    def _push_block(self, block: npt.NDArray[np.int16]) -> None:
        self.buffer.push(block, self.detector.is_speech(block))
