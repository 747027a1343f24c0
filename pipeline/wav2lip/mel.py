"""The Wav2Lip log-mel front end, in numpy, offline and streaming (no librosa, no scipy).

It reproduces ``audio.melspectrogram`` of the original code (librosa 0.7 pinned): pre-emphasis 0.97,
a centred STFT (reflect padding, periodic Hann 800, hop 200), the magnitude, a Slaney mel filterbank, dB
with a -100 dB floor and -20 dB reference, and a symmetric normalisation to [-4, 4].

:func:`melspectrogram` works on a whole clip. :class:`StreamingMel` takes audio as it arrives and emits a
column as soon as its 800-sample window exists. Column ``t`` is centred on sample ``200 t`` and covers
samples ``[200 t - 400, 200 t + 400)``. The stream's start is handled like the offline reflect padding
(the 400 samples before sample 0 are the mirror image of samples 1..400), so every column the stream emits
equals the offline column of the whole clip; only the last two offline columns, whose windows reach past
the end of the clip into its reflection, are never emitted by the stream.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.timing import FEATURE_SAMPLE_RATE_HZ

FloatArray = npt.NDArray[np.float32]
Float64Array = npt.NDArray[np.float64]

SAMPLE_RATE_HZ = FEATURE_SAMPLE_RATE_HZ
N_FFT = 800  # 50 ms
HOP_LENGTH = 200  # 12.5 ms
WIN_LENGTH = N_FFT  # the window fills the FFT, no zero padding
N_FREQS = N_FFT // 2 + 1  # 401 rfft bins
N_MELS = 80
FMIN_HZ = 55.0
FMAX_HZ = 7600.0
PREEMPHASIS = 0.97
REF_LEVEL_DB = 20.0
MIN_LEVEL_DB = -100.0
MAX_ABS_VALUE = 4.0
AMPLITUDE_FLOOR = 10.0 ** (MIN_LEVEL_DB / 20.0)  # 1e-5
MEL_FRAMES_PER_SECOND = SAMPLE_RATE_HZ // HOP_LENGTH  # 80
CENTER_PAD = N_FFT // 2  # 400 samples mirrored at each end of a clip
SILENCE_LEVEL = -MAX_ABS_VALUE  # the value of a column of digital silence

# Slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above (27 mels per factor 6.4).
_SLANEY_HZ_PER_MEL = 200.0 / 3.0
_SLANEY_BREAK_HZ = 1000.0
_SLANEY_BREAK_MEL = _SLANEY_BREAK_HZ / _SLANEY_HZ_PER_MEL  # 15
_SLANEY_LOG_STEP = np.log(6.4) / 27.0


def hz_to_mel(freq_hz: npt.ArrayLike) -> Float64Array:
    """Slaney (``htk=False``) mel of frequencies in Hz."""
    freq_hz = np.asarray(freq_hz, dtype=np.float64)
    linear = freq_hz / _SLANEY_HZ_PER_MEL
    logarithmic = _SLANEY_BREAK_MEL + np.log(np.maximum(freq_hz, _SLANEY_BREAK_HZ) / _SLANEY_BREAK_HZ) / (
        _SLANEY_LOG_STEP
    )
    return np.where(freq_hz >= _SLANEY_BREAK_HZ, logarithmic, linear)


def mel_to_hz(mels: npt.ArrayLike) -> Float64Array:
    """Inverse of :func:`hz_to_mel`."""
    mels = np.asarray(mels, dtype=np.float64)
    linear = mels * _SLANEY_HZ_PER_MEL
    logarithmic = _SLANEY_BREAK_HZ * np.exp(
        _SLANEY_LOG_STEP * (np.maximum(mels, _SLANEY_BREAK_MEL) - _SLANEY_BREAK_MEL)
    )
    return np.where(mels >= _SLANEY_BREAK_MEL, logarithmic, linear)


def mel_filterbank(
    sample_rate_hz: int = SAMPLE_RATE_HZ,
    n_fft: int = N_FFT,
    n_mels: int = N_MELS,
    fmin_hz: float = FMIN_HZ,
    fmax_hz: float = FMAX_HZ,
) -> FloatArray:
    """Slaney-normalised triangular mel filters, ``(n_mels, n_fft // 2 + 1)`` float32: (80, 401).

    Filter ``m`` rises from edge ``m`` to edge ``m + 1`` and falls to edge ``m + 2``, the ``n_mels + 2``
    edges equally spaced in mel between ``fmin_hz`` and ``fmax_hz``; it is scaled by
    ``2 / (edge[m + 2] - edge[m])`` so that its area in Hz is 1 (librosa ``norm='slaney'``).
    """
    bin_hz = np.linspace(0.0, sample_rate_hz / 2.0, n_fft // 2 + 1)
    edges_hz = mel_to_hz(np.linspace(hz_to_mel(fmin_hz), hz_to_mel(fmax_hz), n_mels + 2))
    lower, center, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (bin_hz[None, :] - lower) / (center - lower)
    falling = (upper - bin_hz[None, :]) / (upper - center)
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= 2.0 / (upper - lower)
    return weights.astype(np.float32)


MEL_BASIS = mel_filterbank()  # (80, 401), computed once
HANN_WINDOW = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(WIN_LENGTH) / WIN_LENGTH)  # periodic


def preemphasis(wav: npt.ArrayLike, previous_sample: float = 0.0) -> Float64Array:
    """``y[n] = x[n] - 0.97 x[n-1]`` in float64, with ``x[-1] = previous_sample``."""
    x = np.asarray(wav, dtype=np.float64)
    y = x.copy()
    if x.size:
        y[0] -= PREEMPHASIS * previous_sample
        y[1:] -= PREEMPHASIS * x[:-1]
    return y


def frames_to_mel(frames: Float64Array) -> FloatArray:
    """Windowed magnitude spectra of ``(T, 800)`` sample frames -> normalised log-mel ``(80, T)``."""
    magnitude = np.abs(np.fft.rfft(frames * HANN_WINDOW, axis=1))  # (T, 401)
    mel = MEL_BASIS.astype(np.float64) @ magnitude.T  # (80, T)
    level_db = 20.0 * np.log10(np.maximum(AMPLITUDE_FLOOR, mel)) - REF_LEVEL_DB
    scaled = 2 * MAX_ABS_VALUE * (level_db - MIN_LEVEL_DB) / -MIN_LEVEL_DB - MAX_ABS_VALUE
    return np.clip(scaled, -MAX_ABS_VALUE, MAX_ABS_VALUE).astype(np.float32)


def _frames(padded: Float64Array, count: int) -> Float64Array:
    """``count`` overlapping 800-sample frames, hop 200, from the start of ``padded`` (a strided view)."""
    return np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[: count * HOP_LENGTH : HOP_LENGTH]


def melspectrogram(wav: npt.ArrayLike) -> FloatArray:
    """Whole-clip Wav2Lip mel: 16 kHz float audio in [-1, 1] ``(S,)`` -> ``(80, 1 + S // 200)`` float32.

    Like librosa 0.7's ``stft(center=True, pad_mode='reflect')``; the clip needs more than 400 samples.
    """
    y = preemphasis(wav)
    if y.ndim != 1 or y.size <= CENTER_PAD:
        raise ValueError(f"need a 1-D clip of more than {CENTER_PAD} samples, got shape {y.shape}")
    padded = np.pad(y, CENTER_PAD, mode="reflect")
    return frames_to_mel(_frames(padded, 1 + y.size // HOP_LENGTH))


class StreamingMel:
    """Incremental :func:`melspectrogram`: push audio in chunks of any size, get the new columns back.

    Column ``t`` is emitted once samples up to ``200 t + 400`` have been pushed (column 0 needs 401, for its
    mirrored history). Pre-emphasis state is carried across pushes; only the samples that later windows
    still need are kept (at most 600 plus the last chunk).
    """

    def __init__(self) -> None:
        self._previous_sample = 0.0
        self._head: list[Float64Array] = []  # pre-emphasised samples before the mirror can be built
        self._head_samples = 0
        self._pending: Float64Array | None = None  # padded samples from the next column's window start
        self.columns_emitted = 0

    @property
    def samples_needed_for_next_column(self) -> int:
        """Total pushed samples after which the next column becomes available."""
        return max(CENTER_PAD + 1, HOP_LENGTH * self.columns_emitted + CENTER_PAD)

    def push(self, samples: npt.ArrayLike) -> FloatArray:
        """Feed float audio ``(S,)``; return the newly complete columns ``(80, k)``, k >= 0."""
        x = np.asarray(samples, dtype=np.float64).reshape(-1)
        y = preemphasis(x, self._previous_sample)
        if x.size:
            self._previous_sample = float(x[-1])
        if self._pending is None:
            self._head.append(y)
            self._head_samples += y.size
            if self._head_samples <= CENTER_PAD:
                return np.empty((N_MELS, 0), dtype=np.float32)
            head = np.concatenate(self._head)
            self._head = []
            self._pending = np.concatenate((head[CENTER_PAD:0:-1], head))
        else:
            self._pending = np.concatenate((self._pending, y))
        count = 0 if self._pending.size < N_FFT else 1 + (self._pending.size - N_FFT) // HOP_LENGTH
        if count == 0:
            return np.empty((N_MELS, 0), dtype=np.float32)
        columns = frames_to_mel(_frames(self._pending, count))
        self._pending = self._pending[count * HOP_LENGTH :].copy()
        self.columns_emitted += count
        return columns
