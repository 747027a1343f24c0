from __future__ import annotations

import math

import numpy as np
import pytest

from lipcast.pipeline import features
from lipcast.pipeline.backend import Featurizer
from lipcast.pipeline.features import (
    FLOOR_MIN_DBFS,
    SILENCE_DBFS,
    AttackReleaseSmoother,
    MouthFeaturizer,
    rms_dbfs,
)
from tests.pipeline.synth import hops, sine, vowel

HOP = 640


def feed(featurizer: MouthFeaturizer, signal: np.ndarray) -> np.ndarray:
    """Conditioning of every whole hop of ``signal``, ``(frames, 3)``."""
    return np.stack([featurizer.push(hop) for hop in hops(signal, HOP)])


def test_is_a_featurizer_with_the_default_lookahead() -> None:
    featurizer = MouthFeaturizer()
    assert isinstance(featurizer, Featurizer)
    assert featurizer.lookahead_samples == 320
    assert featurizer.lookahead_ms == 20.0
    assert featurizer.window_samples == 960
    assert featurizer.fft_size == 1024


@pytest.mark.parametrize("amplitude", [1.0, 0.1, 0.001])
def test_sine_level_is_exact(amplitude: float) -> None:
    # 1 kHz at 16 kHz: 16 samples a period, so 960 samples hold whole periods.
    signal = sine(amplitude, 1000.0, 960, phase=0.3).astype(np.float64)
    assert rms_dbfs(signal) == pytest.approx(20 * math.log10(amplitude / math.sqrt(2)), abs=1e-6)


def test_level_ignores_dc_and_reports_silence() -> None:
    signal = sine(0.1, 500.0, 960) + np.float32(0.25)
    assert rms_dbfs(signal) == pytest.approx(-23.0103, abs=1e-4)
    assert rms_dbfs(np.zeros(960)) == SILENCE_DBFS


def test_featurizer_measures_its_window_level() -> None:
    featurizer = MouthFeaturizer()
    feed(featurizer, sine(0.1, 1000.0, 2 * HOP))
    assert featurizer.level_dbfs == pytest.approx(20 * math.log10(0.1 / math.sqrt(2)), abs=1e-5)


def test_noise_floor_rises_at_its_stated_rate() -> None:
    featurizer = MouthFeaturizer(initial_floor_dbfs=-50.0, floor_rise_db_per_s=4.0)
    floors = []
    for hop in hops(sine(0.1, 1000.0, 30 * HOP), HOP):  # -23 dBFS, always above the floor
        featurizer.push(hop)
        floors.append(featurizer.noise_floor_dbfs)
    expected = [-50.0 + 4.0 * 0.040 * n for n in range(1, 31)]
    np.testing.assert_allclose(floors, expected, rtol=0, atol=1e-9)


def test_noise_floor_falls_at_its_stated_rate_and_stops_at_the_level() -> None:
    featurizer = MouthFeaturizer(initial_floor_dbfs=-30.0, floor_fall_db_per_s=60.0)
    level = 20 * math.log10(0.001 / math.sqrt(2))  # -63.01 dBFS
    floors = []
    for hop in hops(sine(0.001, 1000.0, 30 * HOP), HOP):
        featurizer.push(hop)
        floors.append(featurizer.noise_floor_dbfs)
    expected = [max(-30.0 - 60.0 * 0.040 * n, level) for n in range(1, 31)]
    np.testing.assert_allclose(floors, expected, rtol=0, atol=1e-6)


def test_noise_floor_never_drops_below_its_minimum() -> None:
    featurizer = MouthFeaturizer(initial_floor_dbfs=-50.0, floor_fall_db_per_s=60.0)
    floors = []
    for _ in range(20):
        featurizer.push(np.zeros(HOP, dtype=np.float32))
        floors.append(featurizer.noise_floor_dbfs)
    expected = [max(-50.0 - 2.4 * n, FLOOR_MIN_DBFS) for n in range(1, 21)]
    np.testing.assert_allclose(floors, expected, rtol=0, atol=1e-9)


def test_attack_and_release_follow_the_closed_form() -> None:
    step_ms, attack_ms, release_ms = 40.0, 25.0, 70.0
    smoother = AttackReleaseSmoother(
        1, attack_ms=attack_ms, release_ms=release_ms, step_ms=step_ms, rest_epsilon=0.0
    )
    rise = [float(smoother.step(np.ones(1))[0]) for _ in range(10)]
    np.testing.assert_allclose(
        rise, [1 - math.exp(-n * step_ms / attack_ms) for n in range(1, 11)], rtol=1e-12
    )
    top = rise[-1]
    fall = [float(smoother.step(np.zeros(1))[0]) for _ in range(10)]
    np.testing.assert_allclose(
        fall, [top * math.exp(-n * step_ms / release_ms) for n in range(1, 11)], rtol=1e-12
    )


def test_release_snaps_to_exact_zero_below_the_rest_epsilon() -> None:
    smoother = AttackReleaseSmoother(1, attack_ms=0.0, release_ms=70.0, step_ms=40.0)
    assert smoother.step(np.ones(1))[0] == 1.0  # attack 0 ms: a jump
    steps_to_rest = math.ceil(math.log(features.REST_EPSILON) / (-40.0 / 70.0))
    values = [float(smoother.step(np.zeros(1))[0]) for _ in range(steps_to_rest + 3)]
    assert all(v > 0.0 for v in values[: steps_to_rest - 1])
    assert values[steps_to_rest - 1 :] == [0.0] * 4


@pytest.mark.parametrize("noise_dbfs", [None, -60.0])
def test_silence_rests_exactly(noise_dbfs: float | None) -> None:
    featurizer = MouthFeaturizer()
    if noise_dbfs is None:
        signal = np.zeros(50 * HOP, dtype=np.float32)
    else:
        rng = np.random.default_rng(1)
        rms = 10 ** (noise_dbfs / 20)
        signal = (rms * rng.standard_normal(50 * HOP)).astype(np.float32)
    conditioning = feed(featurizer, signal)
    assert conditioning.dtype == np.float32 and conditioning.shape == (50, 3)
    assert not conditioning.any()
    assert all(featurizer.is_at_rest(c) for c in conditioning)


def test_a_voiced_burst_opens_the_mouth_and_the_release_settles_to_rest() -> None:
    rng = np.random.default_rng(2)
    noise = (0.001 * rng.standard_normal(60 * HOP)).astype(np.float32)  # -60 dBFS
    signal = noise.copy()
    signal[20 * HOP : 30 * HOP] += vowel("aa", 10 * HOP)
    conditioning = feed(MouthFeaturizer(), signal)
    assert not conditioning[:19].any()
    assert conditioning[20:30, 0].max() > 0.9
    assert not conditioning[45:].any()  # 0.6 s after the burst everything is exactly 0 again
    assert not MouthFeaturizer().is_at_rest(conditioning[25])


@pytest.mark.parametrize("f0_hz", [100.0, 140.0, 210.0])
def test_spread_and_rounded_vowels_are_told_apart(f0_hz: float) -> None:
    silence = np.zeros(10 * HOP, dtype=np.float32)
    ee = feed(MouthFeaturizer(), np.concatenate([silence, vowel("ee", 10 * HOP, f0_hz=f0_hz)]))
    oo = feed(MouthFeaturizer(), np.concatenate([silence, vowel("oo", 10 * HOP, f0_hz=f0_hz)]))
    _, ee_wide, ee_round = ee[-1]
    _, oo_wide, oo_round = oo[-1]
    assert ee_wide > 0.5 > ee_round
    assert oo_round > 0.5 > oo_wide
    assert ee[-1, 0] > 0.3 and oo[-1, 0] > 0.3


def test_aa_is_open_but_neither_spread_nor_round() -> None:
    signal = np.concatenate([np.zeros(10 * HOP, np.float32), vowel("aa", 10 * HOP)])
    open_, wide, round_ = feed(MouthFeaturizer(), signal)[-1]
    assert open_ > 0.9 and wide < 0.1 and round_ < 0.1


@pytest.mark.parametrize("lookahead_ms", [0.0, 20.0, 40.0])
@pytest.mark.parametrize("offset", [5, 300, 330, 600])
def test_lookahead_contract(lookahead_ms: float, offset: int) -> None:
    """An impulse at sample s lies in frame k's window [k*hop - L, (k+1)*hop) exactly when
    floor(s / hop) <= k <= floor((s + L) / hop); its own hop is that of the last of them."""
    featurizer = MouthFeaturizer(lookahead_ms=lookahead_ms)
    lookahead = featurizer.lookahead_samples
    assert lookahead == round(lookahead_ms * 16)
    position = 10 * HOP + offset
    signal = np.zeros(20 * HOP, dtype=np.float32)
    signal[position] = 0.5
    levels, opens = [], []
    for hop in hops(signal, HOP):
        opens.append(featurizer.push(hop)[0])
        levels.append(featurizer.level_dbfs)
    heard = [k for k, level in enumerate(levels) if level > SILENCE_DBFS]
    assert heard == list(range(position // HOP, (position + lookahead) // HOP + 1))
    own_frame = (position + lookahead) // HOP
    own_start = own_frame * HOP - lookahead  # the own hop ends `lookahead` before the newest sample
    assert own_start <= position < own_start + HOP
    first_open = next(k for k, value in enumerate(opens) if value > 0)
    assert first_open == position // HOP


def test_rejects_a_hop_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match="640"):
        MouthFeaturizer().push(np.zeros(641, dtype=np.float32))
