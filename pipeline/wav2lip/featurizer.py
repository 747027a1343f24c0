"""Per-session streaming mel windows for Wav2Lip: one (80, 16) window per 40 ms hop.

Frame ``i`` (25 fps: 640 samples per hop) is conditioned on 16 mel columns starting at column
``floor((i + window_offset_frames) * 80 / fps)`` — truncation as in the original ``int(i * 80 / fps)``;
the floor only differs for the one negative start of the training alignment, whose missing columns are
silence (-4).

Latency. Column ``t``'s STFT window ends at sample ``200 t + 400``, so the window of frame ``i`` is complete
at sample ``200 start_i + 3400``. Frame ``i``'s own hop ends at ``640 (i + 1)``; the largest excess of the
first over the second (reached whenever ``(i + offset) * 80 / fps`` is whole) is the exact audio need, and
it is the lookahead: the featurizer lags ``need // hop`` whole pushes and puts the rest, ``need % hop``
samples of silence (its *lead*), in front of the call's audio. The frame grid then sits that many samples
before the push grid, so the window of the neediest frames is complete exactly at a push, with no rounding
up to whole hops. Each frame keeps the published relation between its own hop and its mel columns (the
lead only moves where frame 0 starts in the call), so lip sync is unchanged:

======================  ======  ===================  ==================================  ===============
alignment               offset  first column         exact need past the hop = lookahead  lag + lead
======================  ======  ===================  ==================================  ===============
inference (published)    0      int(80 i / fps)      2760 samples = 172.5 ms              4 hops + 200
training                -1      int(80 (i-1) / fps)  2120 samples = 132.5 ms              3 hops + 200
======================  ======  ===================  ==================================  ===============

(at 25 fps; the general rule is in :func:`exact_need_samples`). Rounding up to whole hops instead, as the
first rounds did, cost 27.5 ms (200 / 160 ms). The checkpoints were trained with the training alignment,
the reference inference uses the other (spec sections 9 and 11).

``is_at_rest`` is always False: Wav2Lip regenerates the lower face for every window, silence included,
so no window leaves the avatar frame unchanged; idling is decided elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.timing import FPS
from lipcast.pipeline.wav2lip.mel import (
    CENTER_PAD,
    HOP_LENGTH,
    MEL_FRAMES_PER_SECOND,
    N_MELS,
    SAMPLE_RATE_HZ,
    SILENCE_LEVEL,
    StreamingMel,
)
from lipcast.pipeline.wav2lip.model import MEL_WINDOW_FRAMES

FloatArray = npt.NDArray[np.float32]

INFERENCE_ALIGNMENT = 0  # window_offset_frames of the published inference.py
TRAINING_ALIGNMENT = -1  # window_offset_frames of the training scripts (one frame earlier)
CONDITIONING_SHAPE = (N_MELS, MEL_WINDOW_FRAMES)  # (80, 16)


def window_start_column(frame_index: int, fps: int, window_offset_frames: int) -> int:
    """First mel column of a frame's window: ``floor((i + offset) * 80 / fps)``."""
    return (frame_index + window_offset_frames) * MEL_FRAMES_PER_SECOND // fps


def window_end_sample(start_column: int) -> int:
    """Sample index one past the STFT window of the window's last column."""
    last_column = start_column + MEL_WINDOW_FRAMES - 1
    return HOP_LENGTH * last_column + CENTER_PAD


def exact_need_samples(fps: int, window_offset_frames: int) -> int:
    """Largest (over frames) audio needed past the end of a frame's own hop: 2760 / 2120 at 25 fps."""
    hop = SAMPLE_RATE_HZ // fps
    period = fps // math.gcd(fps, MEL_FRAMES_PER_SECOND)  # the start pattern repeats every `period` frames
    first = max(0, -window_offset_frames)
    return max(
        window_end_sample(window_start_column(i, fps, window_offset_frames)) - hop * (i + 1)
        for i in range(first, first + period)
    )


class Wav2LipFeaturizer:
    """Streaming :class:`~lipcast.pipeline.backend.Featurizer` producing Wav2Lip mel windows.

    After the n-th push (n = 1, 2, ...) it returns the window of frame ``n - 1 - lag_frames``; the pushes
    before frame 0 get a silent window. Frame ``i``'s own hop is the pushed samples
    ``[640 i - lead_samples, 640 (i + 1) - lead_samples)``.
    """

    def __init__(self, fps: int = FPS, window_offset_frames: int = INFERENCE_ALIGNMENT) -> None:
        if window_offset_frames not in (INFERENCE_ALIGNMENT, TRAINING_ALIGNMENT):
            raise ValueError(f"window_offset_frames must be 0 or -1, got {window_offset_frames}")
        if fps <= 0 or SAMPLE_RATE_HZ % fps:
            raise ValueError(f"fps {fps} must divide {SAMPLE_RATE_HZ} Hz")
        self.fps = fps
        self.window_offset_frames = window_offset_frames
        self.samples_per_frame = SAMPLE_RATE_HZ // fps
        need = exact_need_samples(fps, window_offset_frames)
        self.lag_frames, self.lead_samples = divmod(need, self.samples_per_frame)
        self._mel = StreamingMel()
        self._columns = self._mel.push(np.zeros(self.lead_samples, dtype=np.float32))
        self._first_column = 0  # absolute index of self._columns[:, 0]
        self._pushes = 0

    @property
    def lookahead_samples(self) -> int:
        return self.lag_frames * self.samples_per_frame + self.lead_samples

    @property
    def lookahead_ms(self) -> float:
        return self.lookahead_samples * 1000.0 / SAMPLE_RATE_HZ

    def push(self, hop: FloatArray) -> FloatArray:
        """One hop (640 samples at 25 fps) of 16 kHz float audio -> the (80, 16) window of one frame."""
        if hop.shape != (self.samples_per_frame,):
            raise ValueError(f"expected a hop of {self.samples_per_frame} samples, got {hop.shape}")
        new = self._mel.push(hop)
        if new.shape[1]:
            self._columns = np.concatenate((self._columns, new), axis=1)
        self._pushes += 1
        frame_index = self._pushes - 1 - self.lag_frames
        if frame_index < 0:
            return np.full(CONDITIONING_SHAPE, SILENCE_LEVEL, dtype=np.float32)
        start = window_start_column(frame_index, self.fps, self.window_offset_frames)
        window = self._window(start)
        # Columns before the next frame's window are never needed again.
        drop = window_start_column(frame_index + 1, self.fps, self.window_offset_frames)
        drop = min(drop - self._first_column, self._columns.shape[1])
        if drop > 0:
            self._columns = self._columns[:, drop:]
            self._first_column += drop
        return window

    def _window(self, start: int) -> FloatArray:
        stop = start + MEL_WINDOW_FRAMES
        available = self._first_column + self._columns.shape[1]
        if stop > available:
            raise RuntimeError(f"mel column {stop - 1} not computed yet ({available} available)")
        window = np.full(CONDITIONING_SHAPE, SILENCE_LEVEL, dtype=np.float32)
        lo = max(start, 0)
        window[:, lo - start :] = self._columns[:, lo - self._first_column : stop - self._first_column]
        return window

    def is_at_rest(self, conditioning: FloatArray, speech: bool = True) -> bool:
        """Wav2Lip renders silence too; the voice-activity detector decides when the avatar idles."""
        return not speech
