from __future__ import annotations

import logging

import numpy as np
import pytest

from lipcast.streaming.audio_buffer import UNDERRUN_LOG_INTERVAL_S, InputAudioBuffer, make_input_buffer

RATE = 48_000
BLOCK = 960  # 20 ms
TICK = 1920  # 40 ms


def ramp(start: int, n: int = BLOCK) -> np.ndarray:
    return (np.arange(start, start + n) % 30000).astype(np.int16)


def test_silence_until_primed_then_in_order() -> None:
    buf = InputAudioBuffer(RATE, target_ms=60)
    buf.push(ramp(0), speech=True)
    buf.push(ramp(BLOCK), speech=True)
    first = buf.pull(TICK)  # 40 ms buffered < 60 ms target
    assert not first.samples.any() and first.input_pos is None and not first.underrun
    buf.push(ramp(2 * BLOCK), speech=True)
    out = buf.pull(TICK)
    np.testing.assert_array_equal(out.samples, ramp(0, TICK))
    assert out.input_pos == 0 and out.speech
    assert buf.depth_samples == BLOCK


def test_underrun_sends_silence_and_plays_late_audio_afterwards() -> None:
    buf = InputAudioBuffer(RATE, target_ms=40)
    for i in range(2):
        buf.push(ramp(i * BLOCK), speech=True)
    assert buf.pull(TICK).input_pos == 0
    buf.push(ramp(2 * BLOCK), speech=True)  # only 20 ms arrived in time
    dry = buf.pull(TICK)
    assert dry.underrun and not dry.samples.any()
    assert buf.stats.underruns == 1
    buf.push(ramp(3 * BLOCK), speech=True)
    late = buf.pull(TICK)  # re-primed at 40 ms: nothing was dropped
    np.testing.assert_array_equal(late.samples, ramp(2 * BLOCK, TICK))
    assert late.input_pos == 2 * BLOCK


def test_excess_is_trimmed_only_in_silence() -> None:
    buf = InputAudioBuffer(RATE, target_ms=40, trim_hysteresis_ms=20)
    kinds = [True] * 4 + [False] * 6 + [True] * 2  # a burst arrives at once: 240 ms
    for i, speech in enumerate(kinds):
        buf.push(ramp(i * BLOCK), speech=speech)
    out = buf.pull(TICK)
    np.testing.assert_array_equal(out.samples, ramp(0, TICK))
    # Speech at the head is never trimmed.
    assert buf.stats.trimmed_samples == 0
    out = buf.pull(TICK)
    np.testing.assert_array_equal(out.samples, ramp(TICK, TICK))
    # Now the 6 silent blocks are at the head and the buffer (160 ms) is above 40 + 20 ms: all of the
    # silence goes, which brings it back to exactly the 40 ms target.
    assert buf.stats.trimmed_samples == 6 * BLOCK
    assert buf.depth_ms == pytest.approx(40.0)
    tail = buf.pull(TICK)
    np.testing.assert_array_equal(tail.samples, ramp(10 * BLOCK, TICK))
    assert tail.speech


def test_trim_keeps_target_depth() -> None:
    buf = InputAudioBuffer(RATE, target_ms=40, trim_hysteresis_ms=20)
    for i in range(20):
        buf.push(ramp(i * BLOCK), speech=False)
    buf.pull(TICK)
    # 18 blocks left (360 ms): trimmed down to the 40 ms target, in whole blocks.
    assert buf.depth_ms == pytest.approx(40.0)
    assert buf.stats.trimmed_samples == 16 * BLOCK


def test_hard_bound_drops_oldest() -> None:
    buf = InputAudioBuffer(RATE, target_ms=40, max_ms=100)
    for i in range(10):
        buf.push(ramp(i * BLOCK), speech=True)
    assert buf.depth_ms <= 100.0
    assert buf.stats.overflow_samples == 5 * BLOCK
    out = buf.pull(TICK)
    assert out.input_pos == 5 * BLOCK  # the newest audio survives, in order


def test_partial_blocks_are_split_exactly() -> None:
    buf = InputAudioBuffer(RATE, target_ms=10)
    buf.push(ramp(0, 1000), speech=False)
    buf.push(ramp(1000, 3000), speech=True)
    a = buf.pull(1500)
    b = buf.pull(1500)
    np.testing.assert_array_equal(np.concatenate([a.samples, b.samples]), ramp(0, 3000))
    assert (a.input_pos, b.input_pos) == (0, 1500)
    assert b.speech


def test_pulled_audio_says_how_long_it_waited() -> None:
    now = [10.0]
    buf = InputAudioBuffer(RATE, target_ms=40, clock=lambda: now[0])
    buf.push(ramp(0), speech=True)
    now[0] += 0.020
    buf.push(ramp(BLOCK), speech=True)
    now[0] += 0.005
    out = buf.pull(TICK)
    assert out.input_pos == 0 and out.waited_ms == pytest.approx(25.0)  # its first sample came 25 ms ago
    assert buf.pull(TICK).waited_ms is None  # dry: filler has no wait


def test_underruns_are_logged_with_the_newest_arrival_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    buf = make_input_buffer(RATE, 40.0, frame_ms=40.0, clock=lambda: now[0], session_id="sess1")
    caplog.set_level(logging.INFO, logger="lipcast.streaming.audio_buffer")
    for i in range(2):
        buf.push(ramp(i * BLOCK), speech=True)
    buf.pull(TICK)
    buf.push(ramp(2 * BLOCK), speech=True)
    now[0] += 0.065  # the next block is late: the newest one arrived 65 ms before the tick
    assert buf.pull(TICK).underrun
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("[sess1] inbound audio ran dry: 20 of the tick's 40 ms queued")
    assert "the newest arrived 65 ms ago" in line
    now[0] += 1.0
    assert buf.pull(TICK).underrun is False  # not primed: silence, but no second dry tick
    buf.interrupt()
    assert buf.pull(TICK).underrun is False
    buf.push(ramp(0, TICK), speech=True)
    buf.pull(TICK)
    assert buf.pull(TICK).underrun  # within the interval: counted, not logged
    assert len(caplog.records) == 1
    now[0] += UNDERRUN_LOG_INTERVAL_S
    buf.push(ramp(0, TICK), speech=True)
    buf.pull(TICK)
    assert buf.pull(TICK).underrun
    assert len(caplog.records) == 2
    assert (
        "ran dry (and 1 more since the last line): 0 of the tick's 40 ms queued"
        in caplog.records[1].getMessage()
    )
    assert buf.stats.underruns == 3
