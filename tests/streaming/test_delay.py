from __future__ import annotations

import numpy as np

from lipcast.streaming.delay import Delayed, DelayLine


def test_delays_samples_positions_and_flags_exactly() -> None:
    line = DelayLine(5)
    a = line.process(Delayed(np.arange(1, 9, dtype=np.int16), np.arange(8), np.ones(8, bool)))
    np.testing.assert_array_equal(a.samples, [0, 0, 0, 0, 0, 1, 2, 3])
    np.testing.assert_array_equal(a.positions, [-1, -1, -1, -1, -1, 0, 1, 2])
    np.testing.assert_array_equal(a.speech, [False] * 5 + [True] * 3)
    b = line.process(Delayed(np.zeros(3, np.int16), np.full(3, -1), np.zeros(3, bool)))
    np.testing.assert_array_equal(b.samples, [4, 5, 6])


def test_zero_delay_is_identity() -> None:
    line = DelayLine(0)
    out = line.process(Delayed(np.arange(4, dtype=np.int16), np.arange(4), np.zeros(4, bool)))
    np.testing.assert_array_equal(out.samples, np.arange(4))
