"""Offline face detection for avatar preparation: OpenCV's Haar cascade by default, YuNet from a model file.

Both detectors work without downloading anything at run time:

* :class:`HaarFaceDetector` uses the frontal-face cascade that ``opencv-python-headless`` < 5 ships in
  ``cv2.data`` (OpenCV 5 dropped both the files and ``CascadeClassifier``, hence the pin in pyproject.toml).
  It finds a face box but no landmarks; :func:`face_geometry` then places the eyes and mouth by face
  proportions.
* :class:`YuNetFaceDetector` runs a YuNet ONNX model that the user supplies (``--detector-model``) with
  ``cv2.FaceDetectorYN``: more robust to pose and light, and it gives eye and mouth-corner landmarks.

Coordinates are frame pixels, x to the right, y down; boxes are ``x1, y1, x2, y2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import AvatarError

UInt8Array = npt.NDArray[np.uint8]
FloatArray = npt.NDArray[np.float32]

HAAR_CASCADE = "haarcascade_frontalface_alt2.xml"
HAAR_SCALE_FACTOR = 1.1
HAAR_MIN_NEIGHBORS = 4
HAAR_TRACK_FACE_PX = 96  # with a size hint, the image is scaled so the face is about this big (speed)
HAAR_TRACK_SIZE_RANGE = (0.75, 1.35)  # ... and only faces this much smaller or larger than the hint count
MIN_FACE_FRACTION = 0.08  # faces smaller than this share of the frame's shorter side are ignored
YUNET_SCORE_THRESHOLD = 0.6
YUNET_NMS_THRESHOLD = 0.3

# Where a face's parts lie in a Haar frontal-face box, in box sizes from its top-left corner. Measured on the
# hand-annotated default avatar (pipeline/avatars/astronaut/README.md) and on drawn test faces; they agree
# with the usual face proportions (eyes at 3/8 of the box, mouth at 3/4, chin just below the box).
HAAR_EYE_X = (0.30, 0.70)
HAAR_EYE_Y = 0.38
HAAR_MOUTH_X = (0.31, 0.69)  # lip corners
HAAR_MOUTH_Y = 0.77
HAAR_LIP_Y = 0.80  # where the lips meet on the mouth's centre line (a little below the corners)
HAAR_CHIN_Y = 1.12
HAAR_FACE_BOX_Y = (0.10, 1.15)  # the avatar face box: brows to just below the chin (Wav2Lip's convention)
# With landmarks (YuNet): the lip line lies this many inter-corner widths below the corners' mean, the chin
# this many face-box heights above the box's bottom.
LANDMARK_LIP_DROP_PER_WIDTH = 0.08
LANDMARK_CHIN_INSET_PER_HEIGHT = 0.02


class FaceDetectorError(AvatarError):
    """The face detector cannot be set up (missing model file, OpenCV without cascades)."""


@dataclass(frozen=True)
class FaceDetection:
    """One face: its box, a confidence, and, where the detector gives them, landmarks.

    ``landmarks``: None or ``(4, 2)`` float32 rows: the eye on the frame's left, the one on its right, the
    mouth corner on the frame's left, the one on its right.
    """

    box: tuple[float, float, float, float]
    score: float
    landmarks: FloatArray | None = None

    @property
    def size(self) -> float:
        return float(max(self.box[2] - self.box[0], self.box[3] - self.box[1]))

    @property
    def center(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2.0, (self.box[1] + self.box[3]) / 2.0


class FaceDetector(Protocol):
    name: str

    def detect(self, frame_rgb: UInt8Array, size_hint: float | None = None) -> list[FaceDetection]:
        """Faces in an RGB ``(H, W, 3)`` uint8 frame, best first.

        ``size_hint``: the face's size (px) in the frame before, when tracking; a detector may use it to
        search fewer scales.
        """
        ...


class HaarFaceDetector:
    """OpenCV's Viola-Jones frontal-face cascade (shipped in ``cv2.data``); boxes only."""

    name = "haar"

    def __init__(self, cascade_path: Path | None = None) -> None:
        if not hasattr(cv2, "CascadeClassifier") or not hasattr(cv2, "data"):
            raise FaceDetectorError(
                "this OpenCV has no Haar cascades (OpenCV 5 dropped them): install opencv-python-headless<5 "
                "or pass a YuNet model with --detector-model"
            )
        path = cascade_path or Path(cv2.data.haarcascades) / HAAR_CASCADE  # type: ignore[attr-defined]
        if not path.is_file():
            raise FaceDetectorError(f"face cascade {path} not found (opencv-python-headless<5 ships it)")
        self._cascade = cv2.CascadeClassifier(str(path))
        if self._cascade.empty():
            raise FaceDetectorError(f"cannot load the face cascade {path}")

    def detect(self, frame_rgb: UInt8Array, size_hint: float | None = None) -> list[FaceDetection]:
        gray = cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2GRAY)
        scale = 1.0
        min_side = max(24, round(MIN_FACE_FRACTION * min(gray.shape)))
        max_side = 0  # no limit
        if size_hint is not None and size_hint > 0:
            scale = min(1.0, HAAR_TRACK_FACE_PX / size_hint)
            if scale < 1.0:
                gray = cv2.resize(gray, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
            min_side = max(24, round(HAAR_TRACK_SIZE_RANGE[0] * size_hint * scale))
            max_side = max(min_side + 1, round(HAAR_TRACK_SIZE_RANGE[1] * size_hint * scale))
        boxes, _, weights = self._cascade.detectMultiScale3(
            cv2.equalizeHist(gray),
            scaleFactor=HAAR_SCALE_FACTOR,
            minNeighbors=HAAR_MIN_NEIGHBORS,
            minSize=(min_side, min_side),
            maxSize=(max_side, max_side),
            outputRejectLevels=True,
        )
        found = [
            FaceDetection(
                (float(x) / scale, float(y) / scale, float(x + w) / scale, float(y + h) / scale), float(score)
            )
            for (x, y, w, h), score in zip(np.asarray(boxes).reshape(-1, 4), np.ravel(weights), strict=True)
        ]
        return sorted(found, key=lambda d: d.score * d.size, reverse=True)


class YuNetFaceDetector:
    """YuNet (``cv2.FaceDetectorYN``) from a user-supplied ONNX file; boxes with eye and mouth landmarks."""

    name = "yunet"

    def __init__(self, model_path: Path, score_threshold: float = YUNET_SCORE_THRESHOLD) -> None:
        if not model_path.is_file():
            raise FaceDetectorError(f"detector model {model_path} not found")
        try:
            self._net = cv2.FaceDetectorYN.create(
                str(model_path), "", (320, 320), score_threshold, YUNET_NMS_THRESHOLD, 50
            )
        except cv2.error as e:
            raise FaceDetectorError(f"cannot load the YuNet model {model_path}: {e}") from e
        self._size: tuple[int, int] | None = None

    def detect(self, frame_rgb: UInt8Array, size_hint: float | None = None) -> list[FaceDetection]:
        height, width = frame_rgb.shape[:2]
        if self._size != (width, height):
            self._net.setInputSize((width, height))
            self._size = (width, height)
        _, faces = self._net.detect(cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2BGR))
        found = []
        for row in np.asarray(faces if faces is not None else [], dtype=np.float32).reshape(-1, 15):
            x, y, w, h = (float(v) for v in row[:4])
            points = row[4:14].reshape(5, 2)  # right eye, left eye, nose tip, right and left mouth corner
            eyes = points[[0, 1]][np.argsort(points[[0, 1], 0])]
            corners = points[[3, 4]][np.argsort(points[[3, 4], 0])]
            found.append(
                FaceDetection((x, y, x + w, y + h), float(row[14]), np.concatenate((eyes, corners)).copy())
            )
        return sorted(found, key=lambda d: d.score * d.size, reverse=True)


def create_detector(model_path: Path | None = None) -> FaceDetector:
    """YuNet when a model file is given, else the Haar cascade."""
    if model_path is not None:
        return YuNetFaceDetector(model_path)
    return HaarFaceDetector()


# Per-frame face geometry: 4 box + 6 mouth + 4 eye values, the unit that preparation tracks and smooths.
GEOMETRY_SIZE = 14
BOX, MOUTH, EYES = slice(0, 4), slice(4, 10), slice(10, 14)


def face_geometry(detection: FaceDetection) -> FloatArray:
    """The avatar's face box, mouth (:data:`lipcast.pipeline.avatar.MOUTH_FIELDS`) and eyes for one detection.

    ``(14,)`` float32: face box ``x1, y1, x2, y2``, then the mouth row, then the eyes row.
    """
    x1, y1, x2, y2 = detection.box
    width, height = x2 - x1, y2 - y1
    if detection.landmarks is None:  # a Haar box: place the parts by face proportions
        box = (x1, y1 + HAAR_FACE_BOX_Y[0] * height, x2, y1 + HAAR_FACE_BOX_Y[1] * height)
        mouth_y = y1 + HAAR_MOUTH_Y * height
        mouth = (
            x1 + HAAR_MOUTH_X[0] * width,
            mouth_y,
            x1 + HAAR_MOUTH_X[1] * width,
            mouth_y,
            y1 + HAAR_LIP_Y * height,
            y1 + HAAR_CHIN_Y * height,
        )
        eye_y = y1 + HAAR_EYE_Y * height
        eyes = (x1 + HAAR_EYE_X[0] * width, eye_y, x1 + HAAR_EYE_X[1] * width, eye_y)
    else:
        (elx, ely), (erx, ery), (mlx, mly), (mrx, mry) = (tuple(p) for p in detection.landmarks)
        mouth_width = max(1.0, mrx - mlx)
        lip_y = (mly + mry) / 2.0 + LANDMARK_LIP_DROP_PER_WIDTH * mouth_width
        chin_y = max(y2 - LANDMARK_CHIN_INSET_PER_HEIGHT * height, lip_y + 0.5 * mouth_width)
        box = (x1, y1, x2, max(y2, chin_y + 2.0))
        mouth = (mlx, mly, mrx, mry, lip_y, chin_y)
        eyes = (elx, ely, erx, ery)
    return np.array((*box, *mouth, *eyes), dtype=np.float32)


def box_detection(box: Sequence[float]) -> FaceDetection:
    """A manual face box ``x1, y1, x2, y2``: cheek to cheek, forehead to chin.

    Returned as the Haar box that has its chin there, so :func:`face_geometry` treats both alike.
    """
    x1, y1, x2, y2 = (float(v) for v in box)
    if x2 <= x1 or y2 <= y1:
        raise AvatarError(f"face box {tuple(box)} is empty: give x1,y1,x2,y2 with x2 > x1 and y2 > y1")
    return FaceDetection((x1, y1, x2, y1 + (y2 - y1) / HAAR_CHIN_Y), 1.0)
