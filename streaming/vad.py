"""Voice activity: webrtcvad on fixed 20 ms blocks, with a short hangover so word gaps stay "speech"."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import webrtcvad

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ

VAD_FRAME_MS = 20  # webrtcvad accepts 10, 20 or 30 ms
SUPPORTED_RATES_HZ = (8_000, 16_000, 32_000, 48_000)


class SpeechDetector:
    """Marks each 20 ms block of mono int16 audio as speech or silence.

    ``aggressiveness`` is webrtcvad's mode, 0 (least) to 3 (most eager to call audio non-speech).
    ``hangover_ms`` keeps reporting speech for that long after the last voiced block.
    """

    def __init__(
        self, sample_rate_hz: int = MEDIA_SAMPLE_RATE_HZ, aggressiveness: int = 2, hangover_ms: int = 200
    ) -> None:
        if sample_rate_hz not in SUPPORTED_RATES_HZ:
            raise ValueError(f"webrtcvad does not support {sample_rate_hz} Hz")
        if not 0 <= aggressiveness <= 3:
            raise ValueError("VAD aggressiveness must be 0..3")
        self.sample_rate_hz = sample_rate_hz
        self.block_samples = sample_rate_hz * VAD_FRAME_MS // 1000
        self._vad = webrtcvad.Vad(aggressiveness)
        self._hangover_blocks = hangover_ms // VAD_FRAME_MS
        self._since_voice = self._hangover_blocks + 1

    def is_speech(self, block: npt.NDArray[np.int16]) -> bool:
        if len(block) != self.block_samples:
            raise ValueError(f"VAD block must be {self.block_samples} samples, got {len(block)}")
        voiced = self._vad.is_speech(block.tobytes(), self.sample_rate_hz)
        self._since_voice = 0 if voiced else self._since_voice + 1
        return self._since_voice <= self._hangover_blocks


class Reblocker:
    """Cuts a stream of variable-size int16 chunks into fixed-size blocks, keeping the remainder."""

    def __init__(self, block_samples: int) -> None:
        self.block_samples = block_samples
        self._rest = np.zeros(0, np.int16)

    def feed(self, samples: npt.NDArray[np.int16]) -> list[npt.NDArray[np.int16]]:
        data = np.concatenate([self._rest, samples]) if len(self._rest) else samples
        whole = len(data) // self.block_samples * self.block_samples
        self._rest = data[whole:].copy()
        return [data[i : i + self.block_samples] for i in range(0, whole, self.block_samples)]

    @property
    def pending(self) -> int:
        """Samples held short of a whole block."""
        return len(self._rest)

    def take_rest(self) -> npt.NDArray[np.int16]:
        """The samples short of a whole block, removed (a flush, or an interrupt that forgets them)."""
        rest, self._rest = self._rest, np.zeros(0, np.int16)
        return rest
