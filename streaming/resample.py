"""48 kHz -> 16 kHz for the feature path: a linear-phase FIR low-pass and decimation by 3, streaming.

The output lags the input by exactly :data:`DECIMATOR_DELAY_48K` input samples (the filter's group delay), so
the session delays its outgoing 48 kHz audio by the same amount and features stay aligned with what is heard.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.timing import FEATURE_SAMPLE_RATE_HZ, MEDIA_SAMPLE_RATE_HZ

FACTOR = MEDIA_SAMPLE_RATE_HZ // FEATURE_SAMPLE_RATE_HZ  # 3
TAPS = 97  # odd, so the group delay is a whole number of samples
DECIMATOR_DELAY_48K = (TAPS - 1) // 2  # 48 input samples = 1 ms
CUTOFF_HZ = 7_200.0  # below the 8 kHz Nyquist of the output, above the speech band that matters


def lowpass_taps(
    taps: int = TAPS, cutoff_hz: float = CUTOFF_HZ, rate_hz: int = MEDIA_SAMPLE_RATE_HZ
) -> npt.NDArray[np.float64]:
    """Windowed-sinc (Blackman) low-pass with unit DC gain."""
    n = np.arange(taps) - (taps - 1) / 2.0
    h = np.sinc(2.0 * cutoff_hz / rate_hz * n) * np.blackman(taps)
    return h / h.sum()


class Decimator:
    """Streaming 3:1 decimation; input length per call must be a multiple of 3."""

    def __init__(self) -> None:
        self._taps = lowpass_taps()
        self._history = np.zeros(TAPS - 1, dtype=np.float64)

    def process(self, samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """``samples``: 48 kHz float; returns ``len(samples) // 3`` samples at 16 kHz."""
        if len(samples) % FACTOR:
            raise ValueError(f"input length {len(samples)} is not a multiple of {FACTOR}")
        x = np.concatenate([self._history, samples.astype(np.float64)])
        self._history = x[len(x) - (TAPS - 1) :]
        # valid[j] is the causal filter output at new sample j; keep j = 0, 3, 6, ... so that 16 kHz sample m
        # is 48 kHz sample 3m delayed by exactly DECIMATOR_DELAY_48K.
        valid = np.convolve(x, self._taps, mode="valid")
        return valid[::FACTOR].astype(np.float32)
