"""Pasting generated 96x96 faces back into their face boxes, batched on the device.

Only the part of a box that the blend can change is produced: its rows from :func:`first_blended_row` down
(about the lower half). Boxes differ in size, so every item is resampled into a fixed
``(canvas_h, canvas_w)`` canvas whose top-left ``(h - row0, w)`` corner is that part of the item's box; the
rest of the canvas is ignored by the caller. Resampling uses
``grid_sample`` (bilinear, border padding, align_corners=False) with the grid ``2 (x + 0.5) / w - 1``, which
is the half-pixel mapping of ``cv2.resize(..., INTER_LINEAR)``. The lower-face blend mask is drawn once in
96x96 face space (:func:`pipeline.compositing.feathered_box_mask`) and resampled with the face, so its
feather scales with the box. Everything runs in float32 whatever the network's dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pipeline.compositing import blend, feathered_box_mask
from pipeline.wav2lip.model import FACE_SIZE_PX

DEFAULT_FEATHER_PX = 8.0  # in 96x96 face pixels (~8 % of the box)
DEFAULT_MASK_TOP_FRACTION = 0.5  # the blend starts where the network's input mask starts (row 48)


def face_mask(
    feather_px: float = DEFAULT_FEATHER_PX,
    top_fraction: float = DEFAULT_MASK_TOP_FRACTION,
    device: torch.device | None = None,
) -> torch.Tensor:
    """The ``(1, 1, 96, 96)`` float32 lower-face blend mask: 1 where the generated face wins."""
    return feathered_box_mask(
        FACE_SIZE_PX, FACE_SIZE_PX, feather_px, top_fraction=top_fraction, device=device
    )


def first_blended_row(box_height_px: int, top_fraction: float = DEFAULT_MASK_TOP_FRACTION) -> int:
    """The first box row whose resampled blend mask may be non-zero; rows above it keep the original.

    Mask row ``r`` of :func:`face_mask` is zero while ``r + 0.5 <= 96 top_fraction``; the first non-zero
    one is ``R``. Box row ``y`` samples face row ``(y + 0.5) 96 / h - 0.5``, which touches row ``R`` once it
    exceeds ``R - 1``. One row of margin covers float rounding in the sampler.
    """
    first_mask_row = math.floor(FACE_SIZE_PX * top_fraction - 0.5) + 1
    first_row = math.floor((first_mask_row - 0.5) * box_height_px / FACE_SIZE_PX - 0.5) + 1
    return max(0, min(box_height_px - 1, first_row - 1))


def box_grid(
    box_geometry: torch.Tensor, canvas_h: int, canvas_w: int, first_face_row: int = 0
) -> torch.Tensor:
    """Sampling grid ``(N, canvas_h, canvas_w, 2)`` mapping canvas pixels into 96x96 face space.

    ``box_geometry``: ``(N, 3)`` float32 box height, box width and first row (canvas row 0 is that box
    row), in pixels. With ``first_face_row`` the grid samples a face of rows ``first_face_row..95`` only
    (:mod:`.rows`): box row ``y`` still lands on face row ``(y + 0.5) 96 / h - 0.5``, and positions above
    the first row clamp to it (border padding).
    """
    device = box_geometry.device
    ys = torch.arange(canvas_h, device=device, dtype=torch.float32) + 0.5
    xs = torch.arange(canvas_w, device=device, dtype=torch.float32) + 0.5
    box_ys = ys[None, :] + box_geometry[:, 2:3]  # (N, canvas_h) box rows
    if first_face_row:
        face_ys = box_ys * (FACE_SIZE_PX / box_geometry[:, 0:1]) - first_face_row
        gy = 2.0 * face_ys / (FACE_SIZE_PX - first_face_row) - 1.0  # (N, canvas_h)
    else:
        gy = 2.0 * box_ys / box_geometry[:, 0:1] - 1.0
    gx = 2.0 * xs[None, :] / box_geometry[:, 1:2] - 1.0  # (N, canvas_w)
    n = box_geometry.shape[0]
    return torch.stack(
        (gx[:, None, :].expand(n, canvas_h, canvas_w), gy[:, :, None].expand(n, canvas_h, canvas_w)),
        dim=-1,
    )


def paste_faces(
    face_bgr: torch.Tensor,
    base_rgb: torch.Tensor,
    box_geometry: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Blend generated faces into the original face regions.

    ``face_bgr``: (N, 3, R, 96) network output in [0, 1], BGR: face rows ``96 - R..95`` (R = 96: the whole
    face; fewer: :mod:`.rows`, where the mask is zero above them). ``base_rgb``: (N, 3, Hc, Wc) uint8
    original box rows ``row0..h``, top-left aligned. ``box_geometry``: (N, 3) float32 h, w, row0 (see
    :func:`box_grid`). ``mask``: (1, 1, 96, 96) float32.
    Returns (N, Hc, Wc, 3) uint8 RGB; pixels outside an item's region are the base unchanged.
    """
    n, _, canvas_h, canvas_w = base_rgb.shape
    first_face_row = FACE_SIZE_PX - face_bgr.shape[2]
    rgba = torch.cat((face_bgr.float().flip(1), mask[:, :, first_face_row:].expand(n, 1, -1, -1)), dim=1)
    sampled = F.grid_sample(
        rgba,
        box_grid(box_geometry, canvas_h, canvas_w, first_face_row),
        mode="bilinear",
        padding_mode="border",
        align_corners=False,
    )
    rows = torch.arange(canvas_h, device=base_rgb.device, dtype=torch.float32)
    cols = torch.arange(canvas_w, device=base_rgb.device, dtype=torch.float32)
    region_h = box_geometry[:, 0] - box_geometry[:, 2]
    inside = (rows[None, :, None] < region_h[:, None, None]) & (
        cols[None, None, :] < box_geometry[:, 1, None, None]
    )
    alpha = sampled[:, 3:4] * inside[:, None].float()
    out = blend(base_rgb.float(), sampled[:, :3] * 255.0, alpha)
    return out.round_().clamp_(0.0, 255.0).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
