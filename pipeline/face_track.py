"""Following a face through a video and steadying its geometry: the tracking half of avatar preparation.

:class:`FaceTracker` keeps to the face chosen in the previous frame (searching a window around it first);
:func:`fill_gaps` interpolates frames without a face; :func:`smooth_over_time` takes a median over
:data:`MEDIAN_FRAMES` frames against detector outliers, then a Gaussian of :data:`SMOOTH_SIGMA_FRAMES` against
jitter; :func:`clamp_geometry` keeps boxes, mouths and eyes inside the frame.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import AvatarError
from lipcast.pipeline.face_detect import BOX, EYES, MOUTH, FaceDetection, FaceDetector

UInt8Array = npt.NDArray[np.uint8]
FloatArray = npt.NDArray[np.float32]


class PrepareError(AvatarError):
    """The input cannot become an avatar."""


class NoFaceError(PrepareError):
    """No face (or too few frames with one) in the input."""


MEDIAN_FRAMES = 5
SMOOTH_SIGMA_FRAMES = 2.0
TRACK_SEARCH_SCALE = 2.2  # search the next frame within this many face sizes around the last face
TRACK_MAX_JUMP = 0.6  # a face whose centre moved more than this many face sizes is another face


class FaceTracker:
    """Finds the face in each frame, preferring the one nearest the face of the frame before.

    The search starts in a window around the last face (cheap, and immune to faces elsewhere in the frame);
    when that finds nothing, the whole frame is searched.
    """

    def __init__(self, detector: FaceDetector) -> None:
        self.detector = detector
        self.last: FaceDetection | None = None

    def find(self, frame: UInt8Array) -> FaceDetection | None:
        found = self._near_last(frame) if self.last is not None else None
        if found is None:
            candidates = self.detector.detect(frame)
            found = self._pick(candidates)
        if found is not None:
            self.last = found
        return found

    def _near_last(self, frame: UInt8Array) -> FaceDetection | None:
        assert self.last is not None
        height, width = frame.shape[:2]
        cx, cy = self.last.center
        half = TRACK_SEARCH_SCALE * self.last.size / 2.0
        x1, y1 = max(0, int(cx - half)), max(0, int(cy - half))
        x2, y2 = min(width, int(cx + half) + 1), min(height, int(cy + half) + 1)
        if (x2 - x1) >= width * 0.9 and (y2 - y1) >= height * 0.9:
            return None  # the window is the frame: search it once, below
        window = frame[y1:y2, x1:x2]
        candidates = [_shifted(d, x1, y1) for d in self.detector.detect(window, size_hint=self.last.size)]
        return self._pick(candidates)

    def _pick(self, candidates: Sequence[FaceDetection]) -> FaceDetection | None:
        if not candidates:
            return None
        last = self.last
        if last is None:
            return candidates[0]
        lx, ly = last.center

        def distance(d: FaceDetection) -> float:
            cx, cy = d.center
            return math.hypot(cx - lx, cy - ly) / last.size

        best = min(candidates, key=distance)
        return best if distance(best) <= TRACK_MAX_JUMP else None


def _shifted(detection: FaceDetection, dx: float, dy: float) -> FaceDetection:
    x1, y1, x2, y2 = detection.box
    landmarks = None
    if detection.landmarks is not None:
        landmarks = (detection.landmarks + np.array([dx, dy], np.float32)).astype(np.float32)
    return FaceDetection((x1 + dx, y1 + dy, x2 + dx, y2 + dy), detection.score, landmarks)


def fill_gaps(values: FloatArray) -> FloatArray:
    """Replace NaN rows of ``(T, C)`` by interpolating between the nearest found rows (held at the ends)."""
    out = values.astype(np.float64)
    found = ~np.isnan(out).any(axis=1)
    if not found.any():
        raise NoFaceError("no face found")
    frames = np.arange(len(out))
    for column in range(out.shape[1]):
        out[:, column] = np.interp(frames, frames[found], out[found, column])
    return out.astype(np.float32)


def smooth_over_time(
    values: FloatArray, median_frames: int = MEDIAN_FRAMES, sigma_frames: float = SMOOTH_SIGMA_FRAMES
) -> FloatArray:
    """Median then Gaussian filter of each column of ``(T, C)`` along time (edges extended)."""
    count = len(values)
    if count < 2:
        return values.astype(np.float32)
    x = values.astype(np.float64)
    if median_frames > 1:
        half = median_frames // 2
        padded = np.pad(x, ((half, half), (0, 0)), mode="edge")
        windows = np.lib.stride_tricks.sliding_window_view(padded, median_frames, axis=0)
        x = np.median(windows, axis=-1)
    if sigma_frames > 0:
        radius = int(math.ceil(3 * sigma_frames))
        taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma_frames) ** 2)
        taps /= taps.sum()
        padded = np.pad(x, ((radius, radius), (0, 0)), mode="edge")
        x = np.stack([np.convolve(padded[:, c], taps, mode="valid") for c in range(x.shape[1])], axis=1)
    return x.astype(np.float32)


def clamp_geometry(geometry: FloatArray, width: int, height: int) -> FloatArray:
    """Keep boxes, mouths and eyes inside the frame and consistent (what load_avatar checks)."""
    g = geometry.astype(np.float64).copy()
    box = g[:, BOX]
    box[:, [0, 2]] = box[:, [0, 2]].clip(0, width)
    box[:, [1, 3]] = box[:, [1, 3]].clip(0, height)
    mouth = g[:, MOUTH]
    mouth[:, [0, 2]] = mouth[:, [0, 2]].clip(0, width - 1)
    mouth[:, [1, 3, 4, 5]] = mouth[:, [1, 3, 4, 5]].clip(0, height - 1)
    eyes = g[:, EYES]
    eyes[:, [0, 2]] = eyes[:, [0, 2]].clip(0, width - 1)
    eyes[:, [1, 3]] = eyes[:, [1, 3]].clip(0, height - 1)
    g[:, BOX], g[:, MOUTH], g[:, EYES] = box, mouth, eyes
    return g.astype(np.float32)


def int_boxes(boxes: FloatArray, width: int, height: int) -> npt.NDArray[np.int32]:
    out = np.empty(boxes.shape, dtype=np.int32)
    out[:, 0] = np.floor(boxes[:, 0]).clip(0, width - 1)
    out[:, 1] = np.floor(boxes[:, 1]).clip(0, height - 1)
    out[:, 2] = np.maximum(np.ceil(boxes[:, 2]).clip(1, width), out[:, 0] + 1)
    out[:, 3] = np.maximum(np.ceil(boxes[:, 3]).clip(1, height), out[:, 1] + 1)
    return out


# -- the whole preparation --------------------------------------------------------------------------------
