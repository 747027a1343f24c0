"""Per avatar frame: MuseTalk's face box, its 256x256 crop, the masked/reference latent pair, the jaw mask.

Face box (spec 3.1, without DWPose): lipcast's preparation gives a face box, eye centres, lip line and chin
per frame. Landmark 29 (the nose ridge) is put 45 % of the way from the eye line to the lip line (without
eyes: 55 % down the face box); the box runs cheek to cheek (the face box's x), from ``2 y29 - chin`` to the
chin plus the v1.5 margin of 10 px, so it is symmetric about landmark 29 as the reference's is and its
centre row (the masked half's edge) lies 5 px below it.

Latents (spec 3.3-3.4): the crop (Lanczos-4, RGB) in [-1, 1] twice, the lower half (rows 128-255) set to -1
in the first; VAE-encoded, the posterior's mean (``mean``: deterministic, what training used) or a sample
(``sample``: the reference), times 0.18215; concatenated [masked, reference] = 8x32x32.

Blend mask (geometric, instead of the BiSeNet face parser, whose weights' licence is unclear): a half
ellipse below the box's centre row, as wide as the box at that row and reaching the chin, shrunk by half the
blur kernel and blurred with the reference's kernel (``int(0.1 * 2s / 2) * 2 + 1`` for a crop box of side
``2 s``), so it fades to zero inside the box and nothing above the centre row changes. Stored per frame as
uint8 over the patch ``[y_c, y2) x [x1, x2)``.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import torch

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.musetalk.config import FACE_SIZE, SCALING_FACTOR

UInt8Array = npt.NDArray[np.uint8]
EXTRA_MARGIN_PX = 10
NOSE_RIDGE_FRACTION = 0.45  # landmark 29 between the eye line (0) and the lip line (1)
NOSE_RIDGE_FACE_FRACTION = 0.55  # without eyes: down the face box
LATENT_MODES = ("mean", "sample")
ENCODE_BATCH = 16


def face_boxes(avatar: Avatar) -> npt.NDArray[np.int32]:
    """(T, 4) x1, y1, x2, y2 of MuseTalk's face box per frame (see the module docstring)."""
    boxes = avatar.face_boxes.astype(np.float64)
    lip_y = avatar.mouths[:, 4].astype(np.float64)
    chin_y = avatar.mouths[:, 5].astype(np.float64)
    if avatar.eyes is not None:
        eye_y = (avatar.eyes[:, 1] + avatar.eyes[:, 3]).astype(np.float64) / 2
        ridge = eye_y + NOSE_RIDGE_FRACTION * (lip_y - eye_y)
    else:
        ridge = boxes[:, 1] + NOSE_RIDGE_FACE_FRACTION * (boxes[:, 3] - boxes[:, 1])
    y1 = np.maximum(0, np.floor(2 * ridge - chin_y))
    y2 = np.minimum(avatar.height, np.ceil(chin_y) + EXTRA_MARGIN_PX)
    out = np.stack([boxes[:, 0], y1, boxes[:, 2], y2], axis=1).astype(np.int32)
    if ((out[:, 2] - out[:, 0]) < 8).any() or ((out[:, 3] - out[:, 1]) < 8).any():
        raise ValueError(f"avatar {avatar.name!r}: a face box is too small for MuseTalk")
    return out


def center_rows(boxes: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """The frame row of each box's centre (the reference's crop-box centre ``floor((y1 + y2) / 2)``)."""
    return ((boxes[:, 1] + boxes[:, 3]) // 2).astype(np.int32)


def crop_faces(frames: UInt8Array, boxes: npt.NDArray[np.int32]) -> UInt8Array:
    """(T, 256, 256, 3) RGB crops, Lanczos-4, aspect not kept."""
    out = np.empty((len(boxes), FACE_SIZE, FACE_SIZE, 3), np.uint8)
    for i, (x1, y1, x2, y2) in enumerate(boxes):
        out[i] = cv2.resize(frames[i, y1:y2, x1:x2], (FACE_SIZE, FACE_SIZE), interpolation=cv2.INTER_LANCZOS4)
    return out


def vae_inputs(crops: UInt8Array) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked, reference) float32 (T, 3, 256, 256) in [-1, 1]; the masked copy's rows 128-255 are -1."""
    reference = torch.from_numpy(crops).permute(0, 3, 1, 2).float() / 255.0
    masked = reference.clone()
    masked[:, :, FACE_SIZE // 2 :] = 0.0
    return (masked - 0.5) / 0.5, (reference - 0.5) / 0.5


def encode(
    vae: Any, images: torch.Tensor, mode: str, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(B, 3, 256, 256) -> (B, 4, 32, 32) scaled latents, the posterior's mean or a sample."""
    posterior = vae.encode(images).latent_dist
    latent = posterior.mean if mode == "mean" else posterior.sample(generator)
    return latent * SCALING_FACTOR


def latent_pairs(
    vae: Any, crops: UInt8Array, mode: str = "mean", device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(T, 8, 32, 32) float32 on the CPU: [masked latent, reference latent] per frame."""
    if mode not in LATENT_MODES:
        raise ValueError(f"latent mode {mode!r}: one of {', '.join(LATENT_MODES)}")
    dtype = next(vae.parameters()).dtype
    out = []
    with torch.no_grad():
        for start in range(0, len(crops), ENCODE_BATCH):
            masked, reference = vae_inputs(crops[start : start + ENCODE_BATCH])
            pair = [encode(vae, x.to(device, dtype), mode) for x in (masked, reference)]
            out.append(torch.cat(pair, dim=1).float().cpu())
    return torch.cat(out)


def crop_side(box: npt.NDArray[np.int32]) -> int:
    """The side ``2 s`` of the reference's square crop box around a face box (``expand`` 1.5, spec 3.5)."""
    x1, y1, x2, y2 = (int(v) for v in box)
    return 2 * int((max(x2 - x1, y2 - y1) // 2) * 1.5)


def blur_kernel(side: int) -> int:
    """The reference's blur kernel for a crop box of side ``2 s``: ``int(floor(0.1 * 2s / 2) * 2) + 1``."""
    return int(0.1 * side // 2) * 2 + 1


def jaw_mask(box: npt.NDArray[np.int32], center_row: int, chin_y: float) -> UInt8Array:
    """uint8 mask over the patch: rows ``center_row .. y2``, columns ``x1 .. x2`` (module docstring)."""
    x1, _, x2, y2 = (int(v) for v in box)
    height, width = y2 - center_row, x2 - x1
    k = blur_kernel(crop_side(box))
    inset = k // 2 + 1
    mask = np.zeros((height, width), np.uint8)
    axis_x = max(1, width // 2 - inset)
    axis_y = max(1, int(round(min(chin_y + EXTRA_MARGIN_PX / 2, y2) - center_row)) - inset)
    cv2.ellipse(mask, (width // 2, inset), (axis_x, axis_y), 0, 0, 180, 255, thickness=-1)
    mask[:inset] = 0
    blurred = np.asarray(cv2.GaussianBlur(mask, (k, k), 0), dtype=np.uint8)
    return np.ascontiguousarray(blurred)


def jaw_masks(avatar: Avatar, boxes: npt.NDArray[np.int32]) -> list[UInt8Array]:
    centers = center_rows(boxes)
    return [jaw_mask(boxes[i], int(centers[i]), float(avatar.mouths[i, 5])) for i in range(len(boxes))]
