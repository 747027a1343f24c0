"""Synthetic test audio at 16 kHz: tones and formant-shaped vowels (sums of harmonics)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.timing import FEATURE_SAMPLE_RATE_HZ

SAMPLE_RATE_HZ = FEATURE_SAMPLE_RATE_HZ

# First three formants (Hz) of a few vowels, adult male (Peterson & Barney 1952).
FORMANTS_HZ = {
    "ee": (270.0, 2290.0, 3010.0),
    "ih": (390.0, 1990.0, 2550.0),
    "eh": (530.0, 1840.0, 2480.0),
    "aa": (730.0, 1090.0, 2440.0),
    "oo": (300.0, 870.0, 2240.0),
    "ow": (570.0, 840.0, 2410.0),
}
FORMANT_BANDWIDTH_HZ = 80.0


def sine(amplitude: float, frequency_hz: float, samples: int, phase: float = 0.0) -> npt.NDArray[np.float32]:
    t = np.arange(samples) / SAMPLE_RATE_HZ
    return (amplitude * np.sin(2 * np.pi * frequency_hz * t + phase)).astype(np.float32)


def vowel(name: str, samples: int, *, f0_hz: float = 120.0, peak: float = 0.3) -> npt.NDArray[np.float32]:
    """Harmonics of ``f0_hz`` with a -6 dB/octave source slope shaped by the vowel's formant resonances."""
    t = np.arange(samples) / SAMPLE_RATE_HZ
    signal = np.zeros(samples)
    for k in range(1, int(4000 / f0_hz) + 1):
        f = k * f0_hz
        gain = 1.0 / k
        for formant in FORMANTS_HZ[name]:
            gain *= formant**2 / np.hypot(formant**2 - f**2, FORMANT_BANDWIDTH_HZ * f)
        signal += gain * np.sin(2 * np.pi * f * t + 0.7 * k * k)
    return (peak * signal / np.abs(signal).max()).astype(np.float32)


def hops(signal: npt.NDArray[np.float32], hop_samples: int = 640) -> list[npt.NDArray[np.float32]]:
    """Cut ``signal`` into whole hops (a trailing partial hop is dropped)."""
    count = signal.size // hop_samples
    return [signal[i * hop_samples : (i + 1) * hop_samples] for i in range(count)]
