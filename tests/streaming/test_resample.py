from __future__ import annotations

import numpy as np
import pytest

from lipcast.streaming.resample import DECIMATOR_DELAY_48K, Decimator, lowpass_taps


def run(decimator: Decimator, x: np.ndarray, chunk: int) -> np.ndarray:
    return np.concatenate([decimator.process(x[i : i + chunk]) for i in range(0, len(x), chunk)])


def test_impulse_lands_at_the_stated_delay() -> None:
    x = np.zeros(4 * 1920, np.float32)
    x[300] = 1.0
    y = run(Decimator(), x, 1920)
    assert int(np.argmax(y)) == (300 + DECIMATOR_DELAY_48K) // 3


def test_chunking_does_not_change_the_output() -> None:
    x = np.random.default_rng(0).standard_normal(9600).astype(np.float32)
    np.testing.assert_array_equal(run(Decimator(), x, 1920), run(Decimator(), x, 96))


def test_speech_band_passes_and_alias_band_is_rejected() -> None:
    t = np.arange(48_000) / 48_000
    tone = np.sin(2 * np.pi * 1000 * t).astype(np.float32)
    y = run(Decimator(), tone, 960)
    expected = np.sin(2 * np.pi * 1000 * (np.arange(len(y)) * 3 - DECIMATOR_DELAY_48K) / 48_000)
    np.testing.assert_allclose(y[100:], expected[100:], atol=1e-5)
    alias = np.sin(2 * np.pi * 12_000 * t).astype(np.float32)  # would fold to 4 kHz
    assert np.abs(run(Decimator(), alias, 960)[100:]).max() < 1e-3


def test_taps_have_unit_dc_gain_and_linear_phase() -> None:
    h = lowpass_taps()
    assert h.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(h, h[::-1])


def test_rejects_lengths_not_divisible_by_three() -> None:
    with pytest.raises(ValueError):
        Decimator().process(np.zeros(100, np.float32))
