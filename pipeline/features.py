"""Streaming mouth features for the built-in backend: pure DSP, numpy in, numpy out.

Per video frame the featurizer analyses a window made of the frame's own hop (40 ms at 25 fps) and a short
lookahead (20 ms by default), and turns it into three mouth parameters in [0, 1]:

* ``open``: the level (RMS, dBFS) placed between an adaptive noise floor (plus a gate) and the recent speech
  peak: the loudest syllables open the mouth fully, ones :data:`OPEN_RANGE_DB` quieter not at all. It is
  reduced for frames whose energy lies mostly above 4 kHz (fricatives barely move the jaw) and for spread or
  rounded vowels, which open the jaw less than "aa";
* ``wide``: spread lips ("ee", "ih", "eh"): much energy at 1.5-3.5 kHz (a high second formant) relative to
  600-1400 Hz, where back vowels ("aa", "oo", "ow") have their second formant and front vowels a valley;
* ``round``: rounded lips ("oo"): a back vowel (little energy at 1.5-3.5 kHz) whose first-formant region
  is low (the energy centroid of 250-1200 Hz; "aa" is a back vowel too, but its centroid is high).

Each parameter then passes a one-pole smoother with separate attack and release times, and values below
:data:`REST_EPSILON` snap to exactly 0, so silence gives ``(0, 0, 0)`` and the avatar frame is sent as it is.

Level convention: ``dBFS = 20 * log10(rms)`` re an RMS of 1.0, so a full-scale sine reads -3.01 dBFS.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.easing import smoothstep
from lipcast.pipeline.windows import FrameGrid

FloatArray = npt.NDArray[np.float32]

DEFAULT_LOOKAHEAD_MS = 20.0
CONDITIONING_SIZE = 3  # open, wide, round
OPEN, WIDE, ROUND = range(CONDITIONING_SIZE)

# Level and noise floor.
SILENCE_DBFS = -120.0  # the level reported for digital silence (rms 0)
FLOOR_MIN_DBFS = -70.0  # the floor never drops below this, so a tiny hiss over digital silence stays closed
INITIAL_FLOOR_DBFS = -50.0  # start high-ish: the floor falls to a quieter room within a fraction of a second
FLOOR_FALL_DB_PER_S = 60.0  # the floor follows quieter levels fast ...
FLOOR_RISE_DB_PER_S = 4.0  # ... and louder ones slowly, so speech does not become the floor
PEAK_FALL_DB_PER_S = 4.0  # the speech peak jumps up to louder levels and decays this slowly
OPEN_GATE_DB = 6.0  # the level must exceed the floor by this much before the mouth moves
OPEN_RANGE_DB = 24.0  # levels this far below the peak (or the gate, if higher) leave the mouth closed
SHAPE_FADE_IN = 0.5  # wide/round fade in with the loudness from 0 up to this (quiet frames are noisy)
VOWEL_OPEN_REDUCTION = 0.3  # a fully spread or rounded vowel opens the jaw this much less

# Spectral shape.
MID_BAND_HZ = (600.0, 1400.0)  # the second formant of back vowels ("aa", "oo"); a valley in front vowels
HIGH_BAND_HZ = (1500.0, 3500.0)  # the second and third formants of front vowels ("ee")
CENTROID_BAND_HZ = (250.0, 1200.0)  # first-formant region: low centroid = rounded / closed vowel
VOICE_BAND_HZ = (80.0, 4000.0)  # voiced speech energy; the rest up to 8 kHz is mostly frication
# Synthetic vowels (f0 100-250 Hz) give a high-vs-mid ratio of -8..+5 dB for front vowels, -27..-47 dB for
# back ones, and a 250-1200 Hz centroid of 260-530 Hz for "oo", 560-680 for "ow", 750-830 for "aa".
WIDE_TILT_DB = (-20.0, -6.0)  # high-vs-mid energy ratio mapped to wide 0 -> 1
ROUND_TILT_DB = (-14.0, -26.0)  # the same ratio mapped to round 0 -> 1 (lower = further back)
ROUND_CENTROID_HZ = (720.0, 460.0)  # centroid mapped to round 0 -> 1 (lower = rounder)
VOICED_FRACTION = (0.3, 0.7)  # share of energy in VOICE_BAND_HZ mapped to an open weight 0 -> 1
POWER_EPSILON = 1e-20  # keeps ratios finite in digital silence

# Smoothing.
DEFAULT_ATTACK_MS = 25.0
DEFAULT_RELEASE_MS = 70.0
REST_EPSILON = 0.01  # smoothed values below this snap to 0 (0.01 of the jaw drop is far below a pixel)


def rms_dbfs(samples: npt.NDArray[np.floating]) -> float:
    """RMS level in dBFS (re RMS 1.0) of ``samples`` after removing their mean; :data:`SILENCE_DBFS` for 0."""
    x = np.asarray(samples, dtype=np.float64)
    x = x - x.mean()
    mean_square = float(np.dot(x, x)) / max(1, x.size)
    if mean_square <= 0.0:
        return SILENCE_DBFS
    return max(SILENCE_DBFS, 10.0 * math.log10(mean_square))


def one_pole_coefficient(time_constant_ms: float, step_ms: float) -> float:
    """The per-step weight ``1 - exp(-step / tau)`` of a one-pole smoother with time constant ``tau``."""
    if time_constant_ms <= 0.0:
        return 1.0
    return 1.0 - math.exp(-step_ms / time_constant_ms)


def track_noise_floor(
    floor_dbfs: float, level_dbfs: float, fall_db_per_step: float, rise_db_per_step: float
) -> float:
    """Move the floor toward ``level_dbfs`` by at most the given rates; never below :data:`FLOOR_MIN_DBFS`."""
    moved = min(floor_dbfs + rise_db_per_step, max(floor_dbfs - fall_db_per_step, level_dbfs))
    return max(FLOOR_MIN_DBFS, moved)


class AttackReleaseSmoother:
    """One-pole smoothing of a small vector, faster up (attack) than down (release), snapping to 0 at rest.

    Per step ``y += k * (x - y)`` with ``k = 1 - exp(-step_ms / attack_ms)`` where ``x > y`` and the release
    time constant elsewhere; values below ``rest_epsilon`` then become exactly 0.
    """

    def __init__(
        self,
        size: int,
        *,
        attack_ms: float,
        release_ms: float,
        step_ms: float,
        rest_epsilon: float = REST_EPSILON,
    ) -> None:
        self.attack_coefficient = one_pole_coefficient(attack_ms, step_ms)
        self.release_coefficient = one_pole_coefficient(release_ms, step_ms)
        self.rest_epsilon = rest_epsilon
        self.state = np.zeros(size, dtype=np.float64)

    def step(self, target: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Advance one step toward ``target`` (same shape as the state); returns the state (a view)."""
        state = self.state
        coefficient = np.where(target > state, self.attack_coefficient, self.release_coefficient)
        state += coefficient * (target - state)
        state[state < self.rest_epsilon] = 0.0
        return state


class MouthFeaturizer:
    """Per-session streaming featurizer (the :class:`lipcast.pipeline.backend.Featurizer` of the built-in
    backend).

    ``push(hop)`` takes ``grid.samples_per_frame`` samples of 16 kHz mono float32 audio and returns the
    conditioning ``float32 (3,) = [open, wide, round]`` of the frame whose hop ends ``lookahead_samples``
    before the newest sample. Cost per hop: one real FFT of the window (1024 points at the defaults).
    """

    def __init__(
        self,
        *,
        lookahead_ms: float = DEFAULT_LOOKAHEAD_MS,
        attack_ms: float = DEFAULT_ATTACK_MS,
        release_ms: float = DEFAULT_RELEASE_MS,
        floor_fall_db_per_s: float = FLOOR_FALL_DB_PER_S,
        floor_rise_db_per_s: float = FLOOR_RISE_DB_PER_S,
        initial_floor_dbfs: float = INITIAL_FLOOR_DBFS,
        peak_fall_db_per_s: float = PEAK_FALL_DB_PER_S,
        grid: FrameGrid | None = None,
    ) -> None:
        if lookahead_ms < 0.0:
            raise ValueError(f"lookahead_ms must be >= 0, got {lookahead_ms}")
        self.grid = grid or FrameGrid()
        self.hop_samples = self.grid.samples_per_frame
        self._lookahead_samples = self.grid.ms_to_samples(lookahead_ms)
        self.window_samples = self.hop_samples + self._lookahead_samples  # 960 at the defaults
        self.fft_size = 1 << (self.window_samples - 1).bit_length()  # 1024 at the defaults
        hop_ms = self.grid.frame_ms
        self.smoother = AttackReleaseSmoother(
            CONDITIONING_SIZE, attack_ms=attack_ms, release_ms=release_ms, step_ms=hop_ms
        )
        self.floor_fall_db_per_hop = floor_fall_db_per_s * hop_ms / 1000.0
        self.floor_rise_db_per_hop = floor_rise_db_per_s * hop_ms / 1000.0
        self.peak_fall_db_per_hop = peak_fall_db_per_s * hop_ms / 1000.0

        self._taper = np.hanning(self.window_samples + 2)[1:-1]  # no zero end points
        freqs_hz = np.fft.rfftfreq(self.fft_size, d=1.0 / self.grid.sample_rate_hz)
        self._freqs_hz = freqs_hz
        self._mid = _band(freqs_hz, MID_BAND_HZ)
        self._high = _band(freqs_hz, HIGH_BAND_HZ)
        self._centroid = _band(freqs_hz, CENTROID_BAND_HZ)
        self._voice = _band(freqs_hz, VOICE_BAND_HZ)
        self._all = freqs_hz >= VOICE_BAND_HZ[0]

        self._window = np.zeros(self.window_samples, dtype=np.float64)  # the newest samples, oldest first
        self.noise_floor_dbfs = float(initial_floor_dbfs)
        self.level_dbfs = SILENCE_DBFS  # of the last analysed window
        self.peak_dbfs = SILENCE_DBFS

    @property
    def lookahead_samples(self) -> int:
        return self._lookahead_samples

    @property
    def lookahead_ms(self) -> float:
        return self.grid.samples_to_ms(self._lookahead_samples)

    def push(self, hop: FloatArray) -> FloatArray:
        """Feed one hop; return the smoothed ``[open, wide, round]`` of one frame, float32 ``(3,)``."""
        samples = np.asarray(hop, dtype=np.float64).reshape(-1)
        if samples.size != self.hop_samples:
            raise ValueError(f"expected a hop of {self.hop_samples} samples, got {samples.size}")
        window = self._window
        window[: -self.hop_samples] = window[self.hop_samples :]
        window[-self.hop_samples :] = samples
        return self.smoother.step(self._targets(window)).astype(np.float32)

    def is_at_rest(self, conditioning: FloatArray, speech: bool = False) -> bool:
        """Exactly (0, 0, 0): the level gate already tells silence, faster than voice activity does."""
        return not bool(np.any(conditioning))

    def _targets(self, window: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Unsmoothed ``[open, wide, round]`` of one window; updates the level and the noise floor."""
        level = rms_dbfs(window)
        self.level_dbfs = level
        floor = self.noise_floor_dbfs  # judge this window against the floor from before it
        self.noise_floor_dbfs = track_noise_floor(
            floor, level, self.floor_fall_db_per_hop, self.floor_rise_db_per_hop
        )
        self.peak_dbfs = max(level, self.peak_dbfs - self.peak_fall_db_per_hop)
        gate_dbfs = floor + OPEN_GATE_DB
        excess_db = level - gate_dbfs
        if excess_db <= 0.0:
            return np.zeros(CONDITIONING_SIZE)
        top_dbfs = max(self.peak_dbfs, gate_dbfs + OPEN_RANGE_DB)
        bottom_dbfs = max(gate_dbfs, top_dbfs - OPEN_RANGE_DB)
        loudness = min(1.0, max(0.0, (level - bottom_dbfs) / (top_dbfs - bottom_dbfs)))

        centred = window - window.mean()
        power = np.abs(np.fft.rfft(centred * self._taper, n=self.fft_size)) ** 2
        mid = float(power[self._mid].sum())
        high = float(power[self._high].sum())
        voice = float(power[self._voice].sum())
        total = float(power[self._all].sum())
        region = power[self._centroid]
        centroid_hz = float(np.dot(region, self._freqs_hz[self._centroid])) / (
            float(region.sum()) + POWER_EPSILON
        )
        tilt_db = 10.0 * math.log10((high + POWER_EPSILON) / (mid + POWER_EPSILON))
        voiced = smoothstep(*VOICED_FRACTION, voice / (total + POWER_EPSILON))

        wide = smoothstep(*WIDE_TILT_DB, tilt_db)
        round_ = smoothstep(*ROUND_TILT_DB, tilt_db) * smoothstep(*ROUND_CENTROID_HZ, centroid_hz)
        open_ = loudness * voiced * (1.0 - VOWEL_OPEN_REDUCTION * max(wide, round_))
        presence = min(1.0, loudness / SHAPE_FADE_IN) * voiced
        return np.array([open_, wide * presence, round_ * presence])


def _band(freqs_hz: npt.NDArray[np.floating], band_hz: tuple[float, float]) -> npt.NDArray[np.bool_]:
    low_hz, high_hz = band_hz
    return (freqs_hz >= low_hz) & (freqs_hz < high_hz)
