"""Live audio features for MuseTalk, per session (spec 7: the reference takes whole files only).

What the featurizer hands the engine per video frame is the encoder's *input*, not its output: whisper-tiny
runs on the GPU in the same batch as the UNet (36.9 GFLOP per frame, +4.6 % of a frame's work), so a media
worker's CPU only extends a log-mel. The decisions (docs/musetalk.md has the measured deviation):

=================  ===========================================================================================
context W          ``context_s`` (default 30 s) of past audio at most in the encoder's 30 s input
placement          start-aligned, as in training and the reference: the input holds the audio from an origin
                   to now (at most W), zero-padded to 30 s; the origin is the call's start and moves on by
                   ``rebase_s`` (default W) once the frame to emit starts past W (whole pieces: the
                   reference's own 30 s layout by default; a frame in a piece's last Λ is still emitted from
                   its piece, its lookahead cut at the piece's end as the reference's is) or, with a sliding
                   input (rebase < W), as soon as its lookahead would not fit
lookahead Λ        ``lookahead_ms`` after the frame's end, a multiple of 40 ms (0 .. 200; default 80, the
                   least at which no slot of the window is zero: slot 9 is centred 60 ms after the frame's
                   end). Paid in latency one to one: the outgoing audio is delayed by Λ
recompute          every frame: frame f's input is the audio up to the end of f plus Λ, features frozen once
                   emitted (never revised)
log-mel floor      ``floor``: ``running`` (default): M is the largest log-mel value since the call started,
                   so the floor settles after the first loud syllable and silence stays silence;
                   ``input``: M over the current input (the reference's rule; it moves as loud audio enters
                   and leaves); or a number: a fixed M
session start      zero slots, as at a clip start (frame 0 has 4, frame 1 has 2)
frame truncation   feature frames at or after ``A = floor(50 t)`` (integers) are zero (spec 7.2: then a
                   frame's features equal the offline features of the recording truncated at t)
=================  ===========================================================================================

With the default context and rebase, the ``input`` floor and an unlimited lookahead this is the reference's
own piece layout, and its windows equal the offline features exactly (away from the first 80 ms after a
30 s boundary, whose slots before the piece's origin the reference takes from the previous piece:
:mod:`.deviation` checks this).

Conditioning: float32 (81, 100 W + 2). Rows 0-79 are the first 100 W + 2 columns of the 30 s input's log-mel
after floor and scale; row 80 holds, in its first entries, the value of a silent column (the GPU fills the
input's columns past those with it), ``A`` and the window's first feature index ``2f - 4`` (relative to the
origin). Integers are exact in float32 up to 2^24.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.musetalk.features import FEATURES_PER_SECOND, window_start
from lipcast.pipeline.musetalk.mel import (
    LOG_FLOOR,
    N_MELS,
    SAMPLE_RATE_HZ,
    columns,
    complete_columns,
    finish,
    pad_value,
    touched_columns,
)
from lipcast.pipeline.timing import FPS

FloatArray = npt.NDArray[np.float32]

DEFAULT_CONTEXT_S = 30.0
DEFAULT_LOOKAHEAD_MS = 80.0
LOOKAHEAD_STEP_MS = 40.0
MAX_LOOKAHEAD_MS = 200.0
FLOOR_POLICIES = ("running", "input")  # or a number: a fixed M
DEFAULT_FLOOR = "running"
META_ROW = N_MELS  # row 80
META_PAD, META_REAL, META_START = 0, 1, 2
META_FIELDS = 3


def context_columns(context_s: float) -> int:
    """Columns of the 30 s input that ``context_s`` of audio reach (100 per second, and 2 more whose windows
    read its last 200 samples)."""
    return touched_columns(round(context_s * SAMPLE_RATE_HZ))


def conditioning_shape(context_s: float) -> tuple[int, int]:
    return (N_MELS + 1, context_columns(context_s))


def check_settings(context_s: float, rebase_s: float | None, lookahead_ms: float, floor: str) -> None:
    """ValueError for settings the featurizer cannot honour."""
    if not 1.0 <= context_s <= 30.0 or abs(context_s * 25 - round(context_s * 25)) > 1e-9:
        raise ValueError(f"musetalk context {context_s:g} s: between 1 and 30 s, in steps of 40 ms")
    rebase = context_s if rebase_s is None else rebase_s
    if not 0.04 <= rebase <= context_s or abs(rebase * 25 - round(rebase * 25)) > 1e-9:
        raise ValueError(f"musetalk rebase {rebase:g} s: up to the context, in steps of 40 ms")
    if lookahead_ms < 0 or lookahead_ms > MAX_LOOKAHEAD_MS or lookahead_ms % LOOKAHEAD_STEP_MS:
        raise ValueError(
            f"musetalk lookahead {lookahead_ms:g} ms: a multiple of {LOOKAHEAD_STEP_MS:g} ms up to "
            f"{MAX_LOOKAHEAD_MS:g}"
        )
    parse_floor(floor)


def parse_floor(floor: str) -> str | float:
    """``running``, ``input`` or a fixed M (a number)."""
    if floor in FLOOR_POLICIES:
        return floor
    try:
        return float(floor)
    except ValueError as e:
        raise ValueError(f"musetalk floor {floor!r}: running, input or a number (a fixed M)") from e


class MuseTalkFeaturizer:
    """Streaming :class:`~lipcast.pipeline.backend.Featurizer` for MuseTalk (see the module docstring).

    After the n-th push it returns the conditioning of frame ``n - 1 - lag`` (``lag = lookahead / 40 ms``),
    built from the audio up to the end of push n; the pushes before frame 0 get a silent conditioning."""

    def __init__(
        self,
        *,
        context_s: float = DEFAULT_CONTEXT_S,
        rebase_s: float | None = None,
        lookahead_ms: float = DEFAULT_LOOKAHEAD_MS,
        floor: str = DEFAULT_FLOOR,
        fps: int = FPS,
    ) -> None:
        check_settings(context_s, rebase_s, lookahead_ms, floor)
        if fps != 25:
            raise ValueError("the musetalk featurizer runs at 25 fps (the model's training rate)")
        self.samples_per_frame = SAMPLE_RATE_HZ // fps
        self.context_samples = round(context_s * SAMPLE_RATE_HZ)
        self.rebase_samples = round((context_s if rebase_s is None else rebase_s) * SAMPLE_RATE_HZ)
        self.lag_frames = int(lookahead_ms // LOOKAHEAD_STEP_MS)
        self.floor = parse_floor(floor)
        self.shape = conditioning_shape(context_s)
        self._samples = np.zeros(0, np.float32)  # audio since the origin
        self._origin = 0  # absolute sample of the origin (a multiple of a frame's samples)
        self._mel = np.zeros((N_MELS, 0), np.float32)  # columns computed from complete windows
        self._pushes = 0
        self._running_max = LOG_FLOOR

    @property
    def lookahead_samples(self) -> int:
        return self.lag_frames * self.samples_per_frame

    @property
    def lookahead_ms(self) -> float:
        return self.lookahead_samples * 1000.0 / SAMPLE_RATE_HZ

    @property
    def frames_pushed(self) -> int:
        return self._pushes

    def extend_tail(self, samples: FloatArray) -> None:
        """Append less than a hop of audio without emitting a frame (a recording's end, in the deviation
        harness: the reference keeps a clip's last partial frame's samples)."""
        if len(samples) >= self.samples_per_frame:
            raise ValueError("extend_tail takes less than one hop")
        if len(samples):
            self._append(samples.astype(np.float32, copy=False))

    def push(self, hop: FloatArray) -> FloatArray:
        if hop.shape != (self.samples_per_frame,):
            raise ValueError(f"expected a hop of {self.samples_per_frame} samples, got {hop.shape}")
        self._pushes += 1
        self._append(hop.astype(np.float32, copy=False))
        frame = self._pushes - 1 - self.lag_frames
        if frame < 0:
            return self.silence()
        self._rebase_for(frame)
        return self.conditioning(frame)

    def silence(self) -> FloatArray:
        """A frame with no audio at all: zero windows (every slot outside the real frames)."""
        out = np.full(self.shape, pad_value(LOG_FLOOR), np.float32)
        out[META_ROW] = 0.0
        out[META_ROW, META_PAD] = pad_value(LOG_FLOOR)
        out[META_ROW, META_START] = -float(2 * self.shape[1])  # every slot before the origin
        return out

    def _input(self) -> FloatArray:
        """The encoder's audio: from the origin, at most the context (later audio waits for a rebase)."""
        return self._samples[: self.context_samples]

    def _append(self, audio: FloatArray) -> None:
        self._samples = np.concatenate((self._samples, audio))
        self._extend_columns()

    def _extend_columns(self) -> None:
        current = self._input()
        complete = complete_columns(len(current))
        have = self._mel.shape[1]
        if complete > have:
            new = columns(current, have, complete)
            self._mel = np.concatenate((self._mel, new), axis=1)
            self._running_max = max(self._running_max, float(new.max()))

    def _rebase_for(self, frame: int) -> None:
        """Move the origin on (by ``rebase_samples``) until ``frame`` belongs to the input. With whole pieces
        (rebase = context, the reference's layout) a frame belongs to the piece it starts in, its lookahead
        cut at the piece's end as the reference's is; with a sliding input (rebase < context) the frame's
        lookahead must fit in the input."""
        spf = self.samples_per_frame
        while True:
            relative = frame - self._origin // spf
            if self.rebase_samples == self.context_samples:
                inside = relative * spf < self.context_samples
            else:
                inside = (relative + 1 + self.lag_frames) * spf <= self.context_samples
            if inside or not len(self._samples):
                return
            self._rebase()

    def _rebase(self) -> None:
        """Move the origin on by ``rebase_samples``; the columns are recomputed from the new origin."""
        drop = min(self.rebase_samples, len(self._samples))
        self._origin += drop
        self._samples = self._samples[drop:]
        self._mel = np.zeros((N_MELS, 0), np.float32)
        self._extend_columns()

    def conditioning(self, frame: int) -> FloatArray:
        """Frame ``frame``'s conditioning from the audio pushed so far (see the module docstring)."""
        length = len(self._input())
        width = self.shape[1]
        log_mel = np.full((N_MELS, width), LOG_FLOOR, np.float32)
        have = min(self._mel.shape[1], width)
        log_mel[:, :have] = self._mel[:, :have]
        touched = min(touched_columns(length), width)
        if touched > have:  # the last columns read zeros past the audio so far
            log_mel[:, have:touched] = columns(self._input(), have, touched)
        floor_max = self._floor_max(float(log_mel[:, :touched].max()) if touched else LOG_FLOOR)
        out = np.empty(self.shape, np.float32)
        out[:N_MELS] = finish(log_mel, floor_max)
        out[META_ROW] = 0.0
        out[META_ROW, META_PAD] = pad_value(floor_max)
        # integers: the reference's float expression (spec 2.4) loses a frame at some multiples of 640
        # samples, which live would zero slot 9 of a frame now and then
        out[META_ROW, META_REAL] = length * FEATURES_PER_SECOND // SAMPLE_RATE_HZ
        origin_frame = self._origin // self.samples_per_frame
        out[META_ROW, META_START] = window_start(frame - origin_frame)
        return out

    def _floor_max(self, input_max: float) -> float:
        input_max = max(input_max, LOG_FLOOR)
        if self.floor == "input":
            return input_max
        if self.floor == "running":
            self._running_max = max(self._running_max, input_max)
            return self._running_max
        return float(self.floor)

    def is_at_rest(self, conditioning: FloatArray, speech: bool = True) -> bool:
        """MuseTalk renders silence too (a partly open mouth, spec 5): the voice detector decides idling."""
        return not speech
