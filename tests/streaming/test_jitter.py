"""The adaptive jitter buffer: the estimator alone, then the buffer that follows it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from lipcast.streaming.audio_buffer import InputAudioBuffer, make_input_buffer
from lipcast.streaming.jitter import JitterEstimator

RATE = 48_000
BLOCK = 960  # 20 ms
TICK = 1920  # 40 ms


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_steady_arrivals_need_no_extra_buffering() -> None:
    est = JitterEstimator()
    for i in range(100):
        est.observe(5.0 + i * 0.02, i * 0.02)  # a constant 5 s offset cancels out
    assert est.percentile_ms == pytest.approx(0.0, abs=1e-6)
    assert est.jitter_ms == pytest.approx(0.0, abs=1e-6)


def test_target_is_a_high_percentile_of_relative_delay() -> None:
    est = JitterEstimator(window=100, quantile=0.95)
    rng = np.random.default_rng(1)
    late_ms = rng.uniform(0, 30, 100)
    for i, late in enumerate(late_ms):
        est.observe(i * 0.02 + late / 1000, i * 0.02)
    expected = np.quantile(late_ms - late_ms.min(), 0.95)
    assert est.percentile_ms == pytest.approx(expected, rel=1e-6)
    assert 20 < est.jitter_ms < 30


def test_grows_at_once_and_shrinks_slowly_after_the_spike() -> None:
    est = JitterEstimator(window=50, quantile=0.95, shrink_ms_per_s=5.0)
    for i in range(50):
        late = 0.08 if i % 10 == 5 else 0.0  # every tenth block 80 ms late
        est.observe(i * 0.02 + late, i * 0.02)
    assert est.jitter_ms == pytest.approx(80.0, abs=1e-6)
    # The network calms down: once the spike left the window, the target shrinks at 5 ms a second,
    # whatever the caller says (only silence is ever trimmed, so this cuts no speech).
    for i in range(50, 100):
        est.observe(i * 0.02, i * 0.02)
    assert est.percentile_ms == pytest.approx(0.0, abs=1e-6)
    held = est.jitter_ms
    assert 60.0 < held < 80.0  # it shrank, but not at once
    for i in range(100, 151):  # one more second
        est.observe(i * 0.02, i * 0.02)
    assert est.jitter_ms == pytest.approx(held - 5.0, abs=0.15)
    for i in range(151, 1000):
        est.observe(i * 0.02, i * 0.02)
    assert est.jitter_ms == 0.0


def simulate_call(
    buf: InputAudioBuffer,
    clock: Clock,
    *,
    seconds: float,
    arrival_s: Callable[[int], float],
    speech: Callable[[int], bool],
    first_pull_s: float = 0.013,
) -> tuple[list[tuple[float, float]], np.ndarray]:
    """20 ms blocks, block ``i`` arriving at ``arrival_s(i)``; a pull every 40 ms from ``first_pull_s``.

    Returns (time, wait) of every tick that pulled audio, and everything played, in order.
    """
    blocks = round(seconds / 0.02)
    arrivals = [(arrival_s(i), 1, i) for i in range(blocks)]
    ticks = [(first_pull_s + k * 0.04, 0, k) for k in range(blocks // 2)]
    waits: list[tuple[float, float]] = []
    played: list[np.ndarray] = []
    for t, kind, i in sorted(arrivals + ticks):
        clock.now_s = 100.0 + t
        if kind == 1:
            buf.push(ramp(i * BLOCK), speech=speech(i))
            continue
        pulled = buf.pull(TICK)
        if pulled.input_pos is not None:
            played.append(pulled.samples)
            if pulled.waited_ms is not None:
                waits.append((t, pulled.waited_ms))
    return waits, np.concatenate(played)


def run_call_with_a_stall(
    buf: InputAudioBuffer, clock: Clock, *, stall_at_s: float, stall_s: float, seconds: float
) -> list[tuple[float, float]]:
    """Blocks 5 ms into their period (1 s of speech, 0.5 s of silence, repeated), of which those due in
    ``[stall_at_s, stall_at_s + stall_s)`` all arrive at its end. Returns (time, wait) of every tick."""
    end_s = stall_at_s + stall_s

    def arrival_s(i: int) -> float:
        due = i * 0.02 + 0.005
        return end_s if stall_at_s <= due < end_s else due

    waits, _ = simulate_call(
        buf, clock, seconds=seconds, arrival_s=arrival_s, speech=lambda i: (i * 0.02) % 1.5 < 1.0
    )
    return waits


def test_one_stall_at_the_start_of_a_call_is_forgotten_within_seconds() -> None:
    # 150 ms with no audio 1 s into a talking call, then steady arrivals. The buffer grows by what the stall
    # showed (one underrun), gives most of it back within 8 s and is at a fresh call's least wait by 20 s;
    # when the target shrank only in silence, at 5 ms/s, it stayed 100 ms deeper for half a minute.
    clock = Clock()
    buf = make_input_buffer(RATE, None, frame_ms=40.0, clock=clock)
    waits = run_call_with_a_stall(buf, clock, stall_at_s=1.0, stall_s=0.15, seconds=30.0)
    assert buf.stats.underruns == 1
    assert max(w for t, w in waits if 2.0 <= t < 4.0) > 120.0  # the stall's audio, all queued
    assert max(w for t, w in waits if 8.0 <= t < 10.0) <= 70.0
    assert max(w for t, w in waits if t >= 20.0) <= 30.0


def test_underrun_adds_an_allowance() -> None:
    est = JitterEstimator(underrun_step_ms=20.0, max_jitter_ms=30.0)
    est.underrun()
    assert est.jitter_ms == 20.0
    est.underrun()
    assert est.jitter_ms == 30.0  # bounded


def ramp(start: int, n: int = BLOCK) -> np.ndarray:
    return (np.arange(start, start + n) % 30000).astype(np.int16)


def test_adaptive_buffer_starts_at_one_frame_and_grows_with_jitter() -> None:
    clock = Clock()
    buf = make_input_buffer(RATE, None, frame_ms=40.0, clock=clock)
    assert buf.jitter is not None and buf.target_ms == pytest.approx(40.0)
    # Steady 20 ms arrivals: playout starts as soon as one tick's audio is there.
    for i in range(2):
        buf.push(ramp(i * BLOCK), speech=True)
        clock.now_s += 0.02
    assert buf.pull(TICK).input_pos == 0
    # Now every tenth block comes 50 ms late: the 95th percentile covers them, the target grows that much.
    pos = 2 * BLOCK
    for i in range(2, 40):
        late = 0.05 if i % 10 == 0 else 0.0
        clock.now_s = 100.0 + i * 0.02 + late
        buf.push(ramp(pos), speech=True)
        pos += BLOCK
    assert buf.target_ms == pytest.approx(90.0, abs=2.0)


def test_fixed_target_when_given() -> None:
    clock = Clock()
    buf = make_input_buffer(RATE, 60.0, frame_ms=40.0, clock=clock)
    assert buf.jitter is None
    for i in range(30):
        clock.now_s += 0.02 if i % 3 else 0.2  # wild arrivals change nothing
        buf.push(ramp(i * BLOCK), speech=True)
    assert buf.target_ms == pytest.approx(60.0)


def test_adaptive_buffer_never_drops_or_reorders_speech() -> None:
    clock = Clock()
    buf = make_input_buffer(RATE, None, frame_ms=40.0, clock=clock)
    rng = np.random.default_rng(7)
    sent = 0
    out: list[np.ndarray] = []
    # 20 ms blocks with up to 60 ms of jitter (in order), pulled every 40 ms, all speech.
    arrivals = np.sort(np.arange(300) * 0.02 + rng.uniform(0, 0.06, 300))
    ticks = np.arange(0.0, 6.6, 0.04)
    events = sorted([(t, 1, i) for i, t in enumerate(arrivals)] + [(t, 0, -1) for t in ticks])
    for t, kind, _ in events:
        clock.now_s = 100.0 + t
        if kind == 1:
            buf.push(ramp(sent), speech=True)
            sent += BLOCK
        else:
            pulled = buf.pull(TICK)
            if pulled.input_pos is not None:
                out.append(pulled.samples)
    played = np.concatenate(out)
    np.testing.assert_array_equal(played, ramp(0, len(played)))  # a prefix of what was sent, in order
    assert buf.stats.trimmed_samples == 0 and buf.stats.overflow_samples == 0
    assert buf.target_ms > 40.0  # it grew


def test_shrunk_target_is_reached_by_trimming_silence_only() -> None:
    clock = Clock()
    est = JitterEstimator(window=10, shrink_ms_per_s=1000.0)  # fast, for the test
    buf = InputAudioBuffer(RATE, target_ms=40.0, trim_hysteresis_ms=20.0, jitter=est, clock=clock)
    clock.now_s = 0.0
    buf.push(ramp(0), speech=True)
    clock.now_s = 0.12  # the second block 100 ms late
    buf.push(ramp(BLOCK), speech=True)
    assert buf.target_ms == pytest.approx(135.0)  # 40 + the 0.95 quantile of (0, 100 ms)
    played: list[np.ndarray] = []
    for i in range(2, 80):  # then steady arrivals: 8 blocks of speech, then silence; a pull every 40 ms
        clock.now_s = 0.10 + i * 0.02
        buf.push(ramp(i * BLOCK), speech=i < 10)
        if i % 2:
            pulled = buf.pull(TICK)
            if pulled.input_pos is not None:
                played.append(pulled.samples)
    speech = np.concatenate(played)[: 10 * BLOCK]
    np.testing.assert_array_equal(speech, ramp(0, 10 * BLOCK))  # all the speech, in order
    assert buf.target_ms == pytest.approx(40.0)  # the spike left the window; silence let it shrink
    assert buf.stats.trimmed_samples > 0  # the excess went, from the silence
    assert buf.depth_samples <= buf.trim_above_samples


def run_steady_call(
    buf: InputAudioBuffer, clock: Clock, *, seconds: float, late_every: int = 0, late_s: float = 0.0
) -> tuple[list[float], np.ndarray]:
    """Silent blocks arriving 5 ms into their period; every ``late_every``-th block (0: none) comes
    ``late_s`` late. Returns the waits of the pulled audio and everything played, in order."""

    def arrival_s(i: int) -> float:
        return i * 0.02 + 0.005 + (late_s if late_every and i % late_every == late_every - 1 else 0.0)

    waits, played = simulate_call(buf, clock, seconds=seconds, arrival_s=arrival_s, speech=lambda i: False)
    return [w for _, w in waits], played


def test_steady_arrivals_are_trimmed_to_the_least_wait() -> None:
    # Ticks fall 8 ms after every second block: playout primes with a block to spare (waits 48 ms), and
    # the margins show that block was never needed, so one silent block goes and the wait is 28 ms.
    clock = Clock()
    buf = make_input_buffer(RATE, None, frame_ms=40.0, clock=clock)
    waits, played = run_steady_call(buf, clock, seconds=12.0)
    assert waits[0] == pytest.approx(48.0)
    assert waits[-1] == pytest.approx(28.0)
    assert buf.stats.trimmed_samples == BLOCK and buf.stats.underruns == 0
    steps = np.diff(played.astype(np.int32)) % 30000
    assert np.count_nonzero(steps != 1) == 1 and steps[steps != 1][0] == BLOCK + 1  # one block gone, in order


def test_a_deep_start_goes_in_one_trim() -> None:
    # The media clock's first pull comes 93 ms after the first block (a call's first audio waits for its
    # clock): playout primes three blocks deeper than the steady arrivals need. The first trim (1 s of
    # margins) drops all three at once; one block per trim kept the last spare one until 11 s.
    clock = Clock()
    buf = make_input_buffer(RATE, None, frame_ms=40.0, clock=clock)
    waits, played = simulate_call(
        buf,
        clock,
        seconds=12.0,
        arrival_s=lambda i: i * 0.02 + 0.005,
        speech=lambda i: False,
        first_pull_s=0.093,
    )
    assert waits[0][1] == pytest.approx(88.0)
    settled = [w for t, w in waits if t > 1.1]
    assert settled[0] == pytest.approx(28.0) and max(settled) == pytest.approx(28.0)
    assert buf.stats.trimmed_samples == 3 * BLOCK
    assert buf.stats.underruns == 1 and waits[-1][0] == pytest.approx(11.973)  # the last tick: audio ended
    steps = np.diff(played.astype(np.int32)) % 30000
    assert np.count_nonzero(steps != 1) == 1 and steps[steps != 1][0] == 3 * BLOCK + 1  # in order


def test_a_late_block_in_the_window_keeps_the_spare_block() -> None:
    # One block in 50 comes 15 ms late: without the spare block that tick would find the buffer dry
    # (8 ms to spare), so the margins forbid the trim and nothing underruns.
    clock = Clock()
    buf = make_input_buffer(RATE, None, frame_ms=40.0, clock=clock)
    waits, _ = run_steady_call(buf, clock, seconds=12.0, late_every=50, late_s=0.015)
    assert buf.stats.trimmed_samples == 0 and buf.stats.underruns == 0
    assert min(waits) >= 40.0


def test_a_fixed_buffer_is_not_trimmed_by_margin() -> None:
    clock = Clock()
    buf = make_input_buffer(RATE, 40.0, frame_ms=40.0, clock=clock)
    waits, _ = run_steady_call(buf, clock, seconds=12.0)
    assert buf.stats.trimmed_samples == 0
    assert waits[-1] == pytest.approx(48.0)
