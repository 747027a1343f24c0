"""A fixed sample delay for the outgoing audio, carrying each sample's stream position along.

The outgoing audio must lag the analysed audio by the backend's lookahead (plus the decimator's group delay)
so that every video frame leaves with its own audio. Positions travel with the samples so per-frame metadata
can say exactly which input audio a frame carries (-1 marks filler silence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Delayed:
    samples: npt.NDArray[np.int16]
    positions: npt.NDArray[np.int64]
    speech: npt.NDArray[np.bool_]


class DelayLine:
    """Delays int16 samples, their int64 positions and speech flags by exactly ``delay_samples``."""

    def __init__(self, delay_samples: int) -> None:
        if delay_samples < 0:
            raise ValueError("delay must be >= 0")
        self.delay_samples = delay_samples
        self._held = Delayed(
            np.zeros(delay_samples, np.int16),
            np.full(delay_samples, -1, np.int64),
            np.zeros(delay_samples, np.bool_),
        )

    def process(self, chunk: Delayed) -> Delayed:
        """Push ``len(chunk.samples)`` samples and get as many out, ``delay_samples`` older."""
        n = len(chunk.samples)
        if not n == len(chunk.positions) == len(chunk.speech):
            raise ValueError("samples, positions and speech differ in length")
        held = self._held
        joined = Delayed(
            np.concatenate([held.samples, chunk.samples]),
            np.concatenate([held.positions, chunk.positions]),
            np.concatenate([held.speech, chunk.speech]),
        )
        self._held = Delayed(joined.samples[n:], joined.positions[n:], joined.speech[n:])
        return Delayed(joined.samples[:n], joined.positions[:n], joined.speech[:n])
