"""The probe's input audio: a generated pattern of speech-like bursts, or a WAV file the user gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.audio_file import decode_audio
from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ

# Formant pairs (F1, F2) of a few vowels: the bursts cycle through them so the mouth shapes vary too.
VOWELS_HZ = ((730, 1090), (270, 2290), (300, 870), (530, 1840), (570, 840))


def vowel(
    duration_s: float, f0_hz: float, formants_hz: tuple[int, int], level: float, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """A voiced sound: harmonics of ``f0_hz`` (with slight vibrato) shaped by two formant peaks."""
    t = np.arange(int(duration_s * MEDIA_SAMPLE_RATE_HZ)) / MEDIA_SAMPLE_RATE_HZ
    phase = 2 * np.pi * f0_hz * np.cumsum(1.0 + 0.01 * np.sin(2 * np.pi * 5.0 * t)) / MEDIA_SAMPLE_RATE_HZ
    f1, f2 = formants_hz
    out = np.zeros_like(t)
    for k in range(1, int(4000 / f0_hz)):
        freq = k * f0_hz
        gain = np.exp(-(((freq - f1) / 150) ** 2)) + 0.7 * np.exp(-(((freq - f2) / 250) ** 2)) + 0.03
        out += gain * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
    ramp = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.015)  # 15 ms edges: a clean, sharp onset
    return level * ramp * out / (np.abs(out).max() + 1e-12)


def burst_pattern(
    duration_s: float = 12.0, *, lead_in_s: float = 1.5, seed: int = 0, noise_dbfs: float = -70.0
) -> npt.NDArray[np.int16]:
    """Silence, then speech-like bursts of 0.25-1.2 s at -24..-6 dBFS peaks with 0.5-1.2 s pauses.

    Each burst is a few "syllables" (vowels of different shape and pitch); a faint noise floor runs
    throughout, as from a real microphone.
    """
    rng = np.random.default_rng(seed)
    total = int(duration_s * MEDIA_SAMPLE_RATE_HZ)
    audio = np.zeros(total)
    t = lead_in_s
    while True:
        burst_s = rng.uniform(0.25, 1.2)
        if t + burst_s + 0.5 > duration_s:
            break
        level = 10 ** (rng.uniform(-24, -6) / 20)
        start = int(t * MEDIA_SAMPLE_RATE_HZ)
        pos = start
        end = start + int(burst_s * MEDIA_SAMPLE_RATE_HZ)
        while pos < end:
            syllable_s = min(rng.uniform(0.12, 0.3), (end - pos) / MEDIA_SAMPLE_RATE_HZ)
            if syllable_s < 0.05:
                break
            sound = vowel(
                syllable_s, rng.uniform(100, 220), VOWELS_HZ[rng.integers(len(VOWELS_HZ))], level, rng
            )
            audio[pos : pos + len(sound)] += sound
            pos += len(sound)
        t += burst_s + rng.uniform(0.5, 1.2)
    audio += 10 ** (noise_dbfs / 20) * rng.standard_normal(total)
    return np.clip(np.round(audio * 32767), -32768, 32767).astype(np.int16)


def load_audio(path: Path) -> npt.NDArray[np.int16]:
    """Decode any audio file PyAV reads into 48 kHz mono int16."""
    return decode_audio(path, MEDIA_SAMPLE_RATE_HZ, "s16")
