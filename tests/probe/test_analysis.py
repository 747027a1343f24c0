"""The probe's audio analysis tells audio that came back late (a dry jitter buffer, a stalled machine) from
audio that was lost, changed or reordered."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import numpy as np
import numpy.typing as npt
import pytest

from lipcast.probe import analysis
from lipcast.probe.client import CallRecording
from lipcast.probe.patterns import burst_pattern
from tests.fakes import speech_pattern, to_int16

Audio = npt.NDArray[np.int16]
DELAY = 5_000  # samples between sending and receiving, as the server's jitter buffer and lookahead add
SENT = burst_pattern(7.0, seed=3)
BURSTS = analysis.detect_bursts(SENT)


def silence(samples: int) -> Audio:
    return np.zeros(samples, dtype=np.int16)


def measure(received: Audio) -> tuple[float, int, int, list[int | None]]:
    lag, _ = analysis.align(SENT, received)
    lags = [burst_lag for burst_lag, _ in analysis.burst_lags(SENT, received, BURSTS, lag)]
    return analysis.returned_by_burst(SENT, received, BURSTS, lags)


def test_the_pattern_has_bursts_long_enough_to_cut() -> None:
    assert len(BURSTS) == 3 and all(b.end - b.start > 12_000 for b in BURSTS)


def test_audio_returned_whole_is_all_found_at_its_lag() -> None:
    fraction, checked, reordered, first_lags = measure(np.concatenate([silence(DELAY), SENT]))
    assert (fraction, reordered) == (1.0, 0) and checked > 50
    assert first_lags == [DELAY] * 3


@pytest.mark.parametrize("inserted_ms", [40, 150, 600])
def test_silence_inserted_inside_a_burst_is_late_audio_not_lost(inserted_ms: int) -> None:
    """A dry jitter buffer (a stalled machine) plays silence mid-burst, then the rest in order."""
    at = BURSTS[1].start + 5_317  # inside a block: that block is split by the silence
    inserted = inserted_ms * 48
    received = np.concatenate([silence(DELAY), SENT[:at], silence(inserted), SENT[at:]])
    fraction, _, reordered, first_lags = measure(received)
    assert (fraction, reordered) == (1.0, 0)
    # Each burst begins where it begins, although most of the second one came back later.
    assert first_lags == [DELAY, DELAY, DELAY + inserted]


def test_silence_removed_between_bursts_moves_the_next_burst_earlier() -> None:
    """The jitter buffer trims excess depth in pauses only."""
    cut = (BURSTS[1].end + BURSTS[2].start) // 2
    trimmed = 9_600
    received = np.concatenate([silence(DELAY), SENT[:cut], SENT[cut + trimmed :]])
    fraction, _, reordered, first_lags = measure(received)
    assert (fraction, reordered) == (1.0, 0)
    assert first_lags == [DELAY, DELAY, DELAY - trimmed]


def lost_blocks(received: Audio) -> float:
    fraction, checked, _, _ = measure(received)
    return (1.0 - fraction) * checked


def test_audio_dropped_inside_a_burst_is_lost() -> None:
    at, dropped = BURSTS[2].start + 9_600, 4_800  # 100 ms = 5 blocks
    assert lost_blocks(np.concatenate([silence(DELAY), SENT[:at], SENT[at + dropped :]])) >= 4


def test_audio_replaced_by_silence_is_lost_not_late() -> None:
    at, zeroed = BURSTS[2].start + 9_600, 4_800
    received = np.concatenate([silence(DELAY), SENT]).copy()
    received[DELAY + at : DELAY + at + zeroed] = 0
    assert lost_blocks(received) >= 4


def test_audio_replaced_by_noise_is_lost() -> None:
    at, replaced = BURSTS[2].start + 9_600, 4_800
    received = np.concatenate([silence(DELAY), SENT]).copy()
    noise = np.random.default_rng(0).normal(0.0, 3_000.0, replaced)
    received[DELAY + at : DELAY + at + replaced] = noise.astype(np.int16)
    assert lost_blocks(received) >= 4


def test_audio_played_out_of_order_is_caught() -> None:
    at, piece = BURSTS[2].start + 9_600, 2_880  # two 60 ms pieces swapped
    a, b = SENT[at : at + piece], SENT[at + piece : at + 2 * piece]
    received = np.concatenate([silence(DELAY), SENT[:at], b, a, SENT[at + 2 * piece :]])
    fraction, checked, reordered, _ = measure(received)
    assert reordered > 0 or (1.0 - fraction) * checked >= 3, (fraction, reordered)


def test_a_burst_split_soon_after_its_onset_keeps_its_onset() -> None:
    """Periodic speech (the test fakes' syllables repeat every 200 ms): later parts of a burst match its
    onset as well as the onset itself. A dry tick 60 ms in, as seen on a loaded box, once made the whole
    burst read from a later copy, and its last 20 blocks as lost."""
    sent = to_int16(speech_pattern([("silence", 1.0), ("speech", 1.5), ("silence", 1.0)]))
    bursts = analysis.detect_bursts(sent)
    assert len(bursts) == 1
    at = bursts[0].start + 2_880
    received = np.concatenate([silence(DELAY), sent[:at], silence(1_920), sent[at:]])
    lags = [burst_lag for burst_lag, _ in analysis.burst_lags(sent, received, bursts, DELAY + 1_920)]
    fraction, _, reordered, first_lags = analysis.returned_by_burst(sent, received, bursts, lags)
    assert (fraction, reordered, first_lags) == (1.0, 0, [DELAY])


def onset_recording(frames: int) -> CallRecording:
    """Only what the onset search reads: audio sent from t = 0 in 20 ms packets, frames every 40 ms."""
    video = SimpleNamespace(arrived_at=[0.5 + i * 0.04 for i in range(frames)])
    source = SimpleNamespace(sent_at=[i * 0.02 for i in range(frames * 2)])
    return cast(CallRecording, SimpleNamespace(video=video, source=source))


@pytest.mark.parametrize("threshold", [14.0, 16.0])
def test_mouth_onset_is_the_start_of_the_rise_whatever_the_threshold(threshold: float) -> None:
    """A 3-frame crossfade (motion 7.5, 15.5, 23) under codec noise: the threshold (4 x the rest's p99) lands
    near its second frame, so the first crossing is frame 21 or 22; the onset is where the rise began."""
    motion = np.full(40, 1.0)
    motion[12] = 4.0  # a noisy rest frame, not next to the rise
    motion[20:23] = (7.5, 15.5, 23.0)
    motion[23:30] = 23.0
    recording = onset_recording(40)
    burst = analysis.Burst(start=0, end=4_800)
    (latency,) = analysis.onset_latencies_ms(recording, [burst], motion, threshold)
    assert latency is not None
    frame = round((latency / 1000.0 - 0.5) / 0.04)
    crossing = int(np.nonzero(motion > threshold)[0][0])
    assert frame == (20 if 7.5 > threshold / 2 else 21)
    assert crossing - frame >= 1  # the old figure: the crossing itself, one frame later or more


def _mouth_following(delays_s: npt.NDArray[np.float64]) -> tuple[float, float]:
    """A mouth that opens with the loudness of SENT's 40 ms before each frame, ``delays_s`` later."""
    packet_s = analysis.OPUS_PACKET_SAMPLES / analysis.MEDIA_SAMPLE_RATE_HZ
    sent_at = [i * packet_s for i in range(len(SENT) // analysis.OPUS_PACKET_SAMPLES)]
    frames = np.arange(len(delays_s))
    shown_s = frames * 0.040 + 0.040  # the frame carries the 40 ms of speech that ended then
    blocks = SENT[: len(sent_at) * analysis.OPUS_PACKET_SAMPLES].astype(np.float64)
    loudness = np.sqrt((blocks.reshape(len(sent_at), -1) ** 2).mean(axis=1))
    last = np.clip((shown_s / packet_s).astype(int) - 1, 1, len(loudness) - 1)
    motion = (loudness[last] + loudness[last - 1]) / 2.0 + np.random.default_rng(0).normal(0, 50, len(last))
    arrivals = shown_s + delays_s
    return analysis.mouth_speech_correlation(SENT, sent_at, arrivals, motion, delay_ms=150.0)


def test_a_mouth_in_step_with_the_speech_correlates_at_its_delay() -> None:
    frames = int(len(SENT) / analysis.MEDIA_SAMPLE_RATE_HZ / 0.040) - 1
    corr, delay_ms = _mouth_following(np.full(frames, 0.180))
    assert corr > 0.95 and abs(delay_ms - 180.0) <= 10.0


def test_a_call_whose_delay_jumps_mid_way_scores_lower() -> None:
    frames = int(len(SENT) / analysis.MEDIA_SAMPLE_RATE_HZ / 0.040) - 1
    steady, _ = _mouth_following(np.full(frames, 0.180))
    delays = np.where(np.arange(frames) < frames // 2, 0.180, 0.480)  # a 300 ms stall half way
    jumped, _ = _mouth_following(delays)
    assert jumped < steady - 0.2


def test_a_mouth_that_ignores_the_speech_does_not_correlate() -> None:
    packet_s = analysis.OPUS_PACKET_SAMPLES / analysis.MEDIA_SAMPLE_RATE_HZ
    sent_at = [i * packet_s for i in range(len(SENT) // analysis.OPUS_PACKET_SAMPLES)]
    arrivals = np.arange(150) * 0.040 + 0.2
    motion = np.random.default_rng(1).uniform(0, 10, len(arrivals))
    corr, _ = analysis.mouth_speech_correlation(SENT, sent_at, arrivals, motion, delay_ms=150.0, search_ms=0)
    assert abs(corr) < 0.3


def _delays(ms_at: list[tuple[float, float]], step_s: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """Delay series: (until_s, delay_ms) pieces, one chunk every ``step_s``."""
    times, delays, t = [], [], 0.0
    for until_s, ms in ms_at:
        while t < until_s:
            times.append(t)
            delays.append(ms)
            t += step_s
    return np.asarray(times), np.asarray(delays)


def test_the_delay_recovers_where_it_comes_back_within_tolerance_for_good() -> None:
    # clean 120 ms to 10 s, jitter to 30 s (220 ms), then 3 s at 180, 1 s at 130, the rest at 125.
    times, delays = _delays([(10, 120.0), (30, 220.0), (33, 180.0), (34, 130.0), (45, 125.0)])
    r = analysis.delay_recovery(times, delays, impaired_from=10.0, impaired_until=30.0)
    assert r is not None
    assert (r.before_ms, r.during_ms, r.after_ms, r.recovered_s) == (120.0, 220.0, 125.0, 3.0)


def test_a_delay_that_stays_high_never_recovers() -> None:
    times, delays = _delays([(10, 120.0), (30, 220.0), (45, 200.0)])
    r = analysis.delay_recovery(times, delays, impaired_from=10.0, impaired_until=30.0)
    assert r is not None and r.recovered_s is None
    assert analysis.delay_recovery(times, delays, impaired_from=1.0, impaired_until=30.0) is None


def test_a_broken_picture_counts_from_its_last_good_frame_to_the_next_keyframe() -> None:
    arrivals = [k * 0.04 for k in range(100)]  # 25 fps for 4 s
    keyframes_at = [0.0, 1.30, 3.05]
    # Broken at 1.0 s (mended by the keyframe at 1.30), again at 1.1 s (inside it: not counted twice), at
    # 2.5 s (mended at 3.05), and once before the first frame (nothing to count from).
    recoveries = analysis.picture_recoveries_ms(arrivals, keyframes_at, [1.1, 1.0, 2.5, -1.0])
    assert recoveries == [pytest.approx(300.0), pytest.approx(570.0)]
    # Never mended: to the last frame.
    assert analysis.picture_recoveries_ms(arrivals, [0.0], [2.0]) == [pytest.approx(1960.0)]


def test_a_vp8_keyframe_is_told_from_its_first_packet() -> None:
    from lipcast.probe.keyframe_loss import starts_vp8_keyframe

    key, delta = bytes([0x50, 0x01, 0x9D]), bytes([0x51, 0x01, 0x9D])  # frame tag bit 0: 0 key, 1 delta
    assert starts_vp8_keyframe(bytes([0x10]), key)  # S set, partition 0
    assert not starts_vp8_keyframe(bytes([0x10]), delta)
    assert not starts_vp8_keyframe(bytes([0x00]), key)  # not the frame's first packet
    assert not starts_vp8_keyframe(bytes([0x11]), key)  # partition 1
