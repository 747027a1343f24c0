"""Whisper's log-mel (spec 2.2), as columns that a stream can extend, and the piece's floor and scale.

One column per 160 samples (100 per second); column ``j`` is the power spectrum of the periodic-Hann-windowed
400 samples centred on sample ``160 j`` of the piece, through 80 Slaney mel filters (transformers'
``mel_filter_bank``, the filters ``WhisperFeatureExtractor`` uses), as ``log10(max(mel, 1e-10))``. The
piece is what the encoder sees: its samples zero-padded to 30 s and reflect-padded by 200 samples at each
end, so a column near the end of the audio so far reads zeros past it (the reference's rule for a clip that
ends there), and a column wholly past it is exactly ``-10``.

:func:`finish` applies the floor ``max(x, M - 8)`` and the scale ``(x + 4) / 4``; the reference takes ``M``
over the whole 80x3000 piece, a live featurizer chooses its own (:mod:`.featurizer`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]

SAMPLE_RATE_HZ = 16000
N_FFT = 400
HOP = 160
N_MELS = 80
PIECE_SAMPLES = 480_000  # 30 s
PIECE_COLUMNS = 3000  # the encoder's input length (HF refuses any other)
HALF_WINDOW = N_FFT // 2
LOG_FLOOR = -10.0  # log10(1e-10): a column of zeros
FLOOR_RANGE = 8.0  # x <- max(x, M - 8)


@lru_cache(maxsize=1)
def mel_filters() -> npt.NDArray[np.float64]:
    """(201, 80) Slaney-scale, Slaney-normalised filters, 0-8 kHz (as WhisperFeatureExtractor builds them)."""
    from transformers.audio_utils import mel_filter_bank

    return np.asarray(
        mel_filter_bank(
            num_frequency_bins=1 + N_FFT // 2,
            num_mel_filters=N_MELS,
            min_frequency=0.0,
            max_frequency=8000.0,
            sampling_rate=SAMPLE_RATE_HZ,
            norm="slaney",
            mel_scale="slaney",
        ),
        dtype=np.float64,
    )


@lru_cache(maxsize=1)
def _window() -> npt.NDArray[np.float64]:
    return np.hanning(N_FFT + 1)[:-1]  # periodic Hann


def padded_index(positions: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Index into the 30 s zero-padded piece of each position of its 200-sample reflect-padded version."""
    index = positions - HALF_WINDOW
    index = np.where(index < 0, -index, index)
    last = PIECE_SAMPLES - 1
    return np.where(index > last, 2 * last - index, index)


def columns(samples: FloatArray, first: int, stop: int) -> FloatArray:
    """Log-mel columns ``first .. stop-1`` of the piece whose audio so far is ``samples``; (80, n)."""
    if stop <= first:
        return np.zeros((N_MELS, 0), np.float32)
    starts = HOP * np.arange(first, stop, dtype=np.int64)
    index = padded_index(starts[:, None] + np.arange(N_FFT, dtype=np.int64)[None, :])
    length = min(len(samples), PIECE_SAMPLES)
    frames = (
        np.where(index < length, samples[np.minimum(index, max(length - 1, 0))], 0.0)
        if length
        else (np.zeros(index.shape))
    )
    spectrum = np.fft.rfft(frames.astype(np.float64) * _window(), axis=1)
    power = spectrum.real**2 + spectrum.imag**2
    mel = power @ mel_filters()  # (n, 80)
    return np.log10(np.maximum(mel, 1e-10)).T.astype(np.float32)


def touched_columns(length: int) -> int:
    """How many leading columns read at least one of the first ``length`` samples (the rest are -10)."""
    if length <= 0:
        return 0
    # column j reads positions 160 j - 200 .. 160 j + 199 of the piece
    return min(PIECE_COLUMNS, (length - 1 + HALF_WINDOW) // HOP + 1)


def complete_columns(length: int) -> int:
    """How many leading columns read only samples below ``length`` (they never change as audio arrives)."""
    return min(PIECE_COLUMNS, max(0, (length - HALF_WINDOW) // HOP + 1)) if length > HALF_WINDOW else 0


def piece_log_mel(samples: FloatArray) -> FloatArray:
    """The (80, 3000) log-mel of one piece (its first 30 s), before the floor."""
    out = np.full((N_MELS, PIECE_COLUMNS), LOG_FLOOR, np.float32)
    touched = touched_columns(len(samples))
    out[:, :touched] = columns(samples, 0, touched)
    if len(samples) >= PIECE_SAMPLES - HALF_WINDOW:  # the far reflection reads audio too
        out[:, touched - 3 :] = columns(samples, touched - 3, PIECE_COLUMNS)
    return out


def finish(log_mel: FloatArray, floor_max: float) -> FloatArray:
    """The floor ``max(x, M - 8)`` and the scale ``(x + 4) / 4``."""
    return ((np.maximum(log_mel, np.float32(floor_max - FLOOR_RANGE)) + 4.0) / 4.0).astype(np.float32)


def pad_value(floor_max: float) -> float:
    """What a column of zeros becomes after :func:`finish`."""
    return (max(LOG_FLOOR, floor_max - FLOOR_RANGE) + 4.0) / 4.0


def reference_log_mel(samples: FloatArray) -> FloatArray:
    """One piece as the reference computes it: :func:`piece_log_mel`, ``M`` over the whole piece."""
    log_mel = piece_log_mel(samples)
    return finish(log_mel, float(log_mel.max()))
