"""Inter-arrival jitter of the caller's audio, and the playout target it calls for (NetEQ-like).

Every block of inbound audio carries its position in the caller's stream. If the network delivered it with
a constant delay, ``arrival_s - position_s`` would be constant; its spread is the jitter. The estimator keeps
that *relative delay* of the last ``window`` blocks, measured from the fastest of them (so a constant network
delay or an offset between the two clocks cancels out, and a slowly drifting client clock is followed as the
window moves on), and reports a high percentile of it: the extra audio the buffer must hold so that
``quantile`` of the blocks arrive before they are played.

The target it asks for grows at once (a late block must not find the buffer dry twice) and shrinks slowly,
``shrink_ms_per_s``, once the spike has left the window. It shrinks while the caller speaks too: the buffer
gives up depth only by trimming silence anyway (:mod:`lipcast.streaming.audio_buffer`), so a lower target
during speech only lets the next pause take all the excess at once. (Shrinking only in silence, as before,
kept a call that began with one 130 ms stall at +100 ms for over 30 s of normal speech.) An underrun adds
``underrun_step_ms`` on top (the percentile did not cover what happened), which decays the same way.
"""

from __future__ import annotations

import numpy as np

DEFAULT_WINDOW_BLOCKS = 250  # 5 s of 20 ms blocks
DEFAULT_QUANTILE = 0.95
DEFAULT_SHRINK_MS_PER_S = 20.0  # a 100 ms spike is forgotten 5 s after it left the window
DEFAULT_UNDERRUN_STEP_MS = 20.0


class JitterEstimator:
    """Relative-delay percentile over a sliding window of arrivals, with grow-fast / shrink-slow memory."""

    def __init__(
        self,
        *,
        window: int = DEFAULT_WINDOW_BLOCKS,
        quantile: float = DEFAULT_QUANTILE,
        shrink_ms_per_s: float = DEFAULT_SHRINK_MS_PER_S,
        underrun_step_ms: float = DEFAULT_UNDERRUN_STEP_MS,
        max_jitter_ms: float = 500.0,
    ) -> None:
        if window < 2 or not 0 < quantile <= 1 or shrink_ms_per_s < 0 or underrun_step_ms < 0:
            raise ValueError("need window >= 2, 0 < quantile <= 1 and non-negative rates")
        self.quantile = quantile
        self.shrink_ms_per_s = shrink_ms_per_s
        self.underrun_step_ms = underrun_step_ms
        self.max_jitter_ms = max_jitter_ms
        self._delays_s = np.zeros(window, np.float64)
        self._count = 0
        self._held_ms = 0.0  # what the target currently asks for (percentile + underrun allowance)
        self._last_arrival_s: float | None = None

    @property
    def observed(self) -> int:
        """Blocks in the window."""
        return min(self._count, len(self._delays_s))

    @property
    def percentile_ms(self) -> float:
        """The window's ``quantile`` of relative delay (0 until two blocks arrived)."""
        n = self.observed
        if n < 2:
            return 0.0
        delays = self._delays_s[:n]
        return float(np.quantile(delays - delays.min(), self.quantile)) * 1000.0

    @property
    def jitter_ms(self) -> float:
        """Extra buffering the target asks for now (grown at once, shrunk slowly)."""
        return self._held_ms

    def observe(self, arrival_s: float, position_s: float) -> None:
        """One block arrived at ``arrival_s`` (the server's clock); its first sample is at ``position_s`` of
        the caller's stream."""
        self._delays_s[self._count % len(self._delays_s)] = arrival_s - position_s
        self._count += 1
        elapsed_s = 0.0 if self._last_arrival_s is None else max(0.0, arrival_s - self._last_arrival_s)
        self._last_arrival_s = arrival_s
        wanted = min(self.percentile_ms, self.max_jitter_ms)
        if wanted >= self._held_ms:
            self._held_ms = wanted
        else:
            self._held_ms = max(wanted, self._held_ms - self.shrink_ms_per_s * elapsed_s)

    def underrun(self) -> None:
        """The buffer ran dry: hold more (decays like the percentile)."""
        self._held_ms = min(self.max_jitter_ms, self._held_ms + self.underrun_step_ms)
