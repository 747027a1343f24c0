"""Wav2Lip face inputs for avatar frames (spec section 10), prepared once per avatar.

A face input is the frame's face box (optionally padded) cut out, resized to 96x96 with OpenCV's bilinear
``cv2.resize``, converted RGB -> BGR (the network was trained on BGR ``cv2.imread`` crops), then stacked as
``[copy with rows 48..95 zeroed, unmasked copy]`` on channels and scaled by 1/255: ``(6, 96, 96)`` float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.wav2lip.model import FACE_SIZE_PX

FloatArray = npt.NDArray[np.float32]
UInt8Array = npt.NDArray[np.uint8]
BoxArray = npt.NDArray[np.int32]

MASK_START_ROW = FACE_SIZE_PX // 2  # 48: rows 48..95 (the lower half) are hidden from the network
DEFAULT_FACE_PADS = (0, 10, 0, 0)  # top, bottom, left, right in frame pixels (inference.py's default)


def pad_boxes(boxes: BoxArray, pads: Sequence[int], height: int, width: int) -> BoxArray:
    """Grow ``(T, 4)`` x1, y1, x2, y2 boxes by ``pads`` (top, bottom, left, right), clipped to the frame."""
    if len(pads) != 4:
        raise ValueError(f"pads must be (top, bottom, left, right), got {pads!r}")
    top, bottom, left, right = (int(p) for p in pads)
    boxes = np.asarray(boxes, dtype=np.int32).reshape(-1, 4)
    out = np.empty_like(boxes)
    out[:, 0] = np.maximum(0, boxes[:, 0] - left)
    out[:, 1] = np.maximum(0, boxes[:, 1] - top)
    out[:, 2] = np.minimum(width, boxes[:, 2] + right)
    out[:, 3] = np.minimum(height, boxes[:, 3] + bottom)
    if (out[:, 2] <= out[:, 0]).any() or (out[:, 3] <= out[:, 1]).any():
        raise ValueError("a padded face box is empty")
    return out


def crop_face_bgr(frame_rgb: UInt8Array, box: Sequence[int]) -> UInt8Array:
    """``frame[y1:y2, x1:x2]`` of an RGB ``(H, W, 3)`` frame, resized to 96x96 (bilinear), as BGR uint8."""
    x1, y1, x2, y2 = (int(v) for v in box)
    crop = frame_rgb[y1:y2, x1:x2]
    face = cv2.resize(crop, (FACE_SIZE_PX, FACE_SIZE_PX), interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(face[:, :, ::-1])


def face_input(face_bgr: UInt8Array) -> FloatArray:
    """A 96x96x3 BGR uint8 face -> the network's ``(6, 96, 96)`` float32 input in [0, 1]."""
    if face_bgr.shape != (FACE_SIZE_PX, FACE_SIZE_PX, 3):
        raise ValueError(f"expected a 96x96x3 face, got {face_bgr.shape}")
    masked = face_bgr.copy()
    masked[MASK_START_ROW:] = 0
    stacked = np.concatenate((masked, face_bgr), axis=2)  # (96, 96, 6): masked first
    return np.ascontiguousarray(stacked.transpose(2, 0, 1)).astype(np.float32) / np.float32(255.0)


def prepare_face_inputs(
    avatar: Avatar, pads: Sequence[int] = DEFAULT_FACE_PADS
) -> tuple[FloatArray, BoxArray]:
    """Face inputs ``(T, 6, 96, 96)`` float32 for every avatar frame, and the padded boxes ``(T, 4)``."""
    boxes = pad_boxes(avatar.face_boxes, pads, avatar.height, avatar.width)
    inputs = np.stack([face_input(crop_face_bgr(f, b)) for f, b in zip(avatar.frames, boxes, strict=True)])
    return inputs, boxes
