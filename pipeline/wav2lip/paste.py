"""Pasting generated 96x96 faces back into their face boxes, batched on the device.

Only the part of a box that the blend can change is produced: its rows from :func:`first_blended_row` down
(about the lower half). Boxes differ in size, so every item is resampled into a fixed
``(canvas_h, canvas_w)`` canvas whose top-left ``(h - row0, w)`` corner is that part of the item's box; the
rest of the canvas is ignored by the caller. Resampling uses
``grid_sample`` (bilinear, border padding, align_corners=False) with the grid ``2 (x + 0.5) / w - 1``, which
is the half-pixel mapping of ``cv2.resize(..., INTER_LINEAR)``. The lower-face blend mask is drawn once in
96x96 face space (:func:`lipcast.pipeline.compositing.feathered_box_mask`) and resampled with the face, so its
feather scales with the box. Everything runs in float32 whatever the network's dtype.

What depends only on an avatar frame's box is computed once per frame (:func:`paste_table`): the grid is
separable (a row coordinate per canvas row, a column coordinate per canvas column), and so is the blend
weight, because the mask is an outer product of a row and a column profile and bilinear resampling on a
separable grid keeps it one (the part of the canvas outside the box is a row and a column cut-off). A
render then gathers one small row per item instead of building the grid and the mask anew.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lipcast.pipeline.compositing import blend, feathered_box_mask, feathered_box_profiles
from lipcast.pipeline.wav2lip.model import FACE_SIZE_PX

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


def face_mask_profiles(
    feather_px: float = DEFAULT_FEATHER_PX,
    top_fraction: float = DEFAULT_MASK_TOP_FRACTION,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The row and column profiles ``(96,)`` of :func:`face_mask` (it is their outer product)."""
    return feathered_box_profiles(
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


def box_axes(
    box_geometry: torch.Tensor, canvas_h: int, canvas_w: int, first_face_row: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid's row and column coordinates, ``(N, canvas_h)`` and ``(N, canvas_w)``, in grid_sample's
    normalised face space.

    ``box_geometry``: ``(N, 3)`` float32 box height, box width and first row (canvas row 0 is that box
    row), in pixels. With ``first_face_row`` the coordinates address a face of rows ``first_face_row..95``
    only (:mod:`.rows`): box row ``y`` still lands on face row ``(y + 0.5) 96 / h - 0.5``, and positions
    above the first row clamp to it (border padding).
    """
    device = box_geometry.device
    ys = torch.arange(canvas_h, device=device, dtype=torch.float32) + 0.5
    xs = torch.arange(canvas_w, device=device, dtype=torch.float32) + 0.5
    box_ys = ys[None, :] + box_geometry[:, 2:3]  # (N, canvas_h) box rows
    if first_face_row:
        face_ys = box_ys * (FACE_SIZE_PX / box_geometry[:, 0:1]) - first_face_row
        gy = 2.0 * face_ys / (FACE_SIZE_PX - first_face_row) - 1.0
    else:
        gy = 2.0 * box_ys / box_geometry[:, 0:1] - 1.0
    gx = 2.0 * xs[None, :] / box_geometry[:, 1:2] - 1.0
    return gy, gx


def axes_grid(gy: torch.Tensor, gx: torch.Tensor) -> torch.Tensor:
    """The sampling grid ``(N, H, W, 2)`` (x first, as grid_sample wants) of row and column coordinates."""
    n, height, width = gy.shape[0], gy.shape[1], gx.shape[1]
    return torch.stack((gx[:, None, :].expand(n, height, width), gy[:, :, None].expand(n, height, width)), -1)


def box_grid(
    box_geometry: torch.Tensor, canvas_h: int, canvas_w: int, first_face_row: int = 0
) -> torch.Tensor:
    """Sampling grid ``(N, canvas_h, canvas_w, 2)``: canvas pixels in face space (:func:`box_axes`)."""
    return axes_grid(*box_axes(box_geometry, canvas_h, canvas_w, first_face_row))


def _resample_1d(profile: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """``profile`` (L,) sampled at grid coordinates ``coords`` (N, M) as grid_sample samples (bilinear,
    border, align_corners=False) an image one row high."""
    n, m = coords.shape
    image = profile.view(1, 1, 1, -1).expand(n, 1, 1, -1)
    grid = torch.stack((coords, torch.zeros_like(coords)), dim=-1)[:, None]  # (N, 1, M, 2)
    out = F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.view(n, m)


def paste_table(
    box_geometry: torch.Tensor,
    canvas_h: int,
    canvas_w: int,
    profiles: tuple[torch.Tensor, torch.Tensor],
    first_face_row: int = 0,
) -> torch.Tensor:
    """What the paste of each frame needs, one float32 row per frame: ``(N, 2 (canvas_h + canvas_w))``.

    Packed as the grid's row coordinates (canvas_h), its column coordinates (canvas_w), the blend weight's
    row factor (canvas_h) and its column factor (canvas_w). ``profiles``: :func:`face_mask_profiles`. The
    weight is zero outside the item's region (rows below the box, columns right of it) and, with
    ``first_face_row``, wherever the full-face mask is (rows above it clamp to a zero row).
    """
    gy, gx = box_axes(box_geometry, canvas_h, canvas_w, first_face_row)
    rows_profile, cols_profile = profiles
    wy = _resample_1d(rows_profile[first_face_row:].float(), gy)
    wx = _resample_1d(cols_profile.float(), gx)
    rows = torch.arange(canvas_h, device=gy.device, dtype=torch.float32)
    cols = torch.arange(canvas_w, device=gy.device, dtype=torch.float32)
    region_h = box_geometry[:, 0:1] - box_geometry[:, 2:3]
    wy = wy * (rows[None, :] < region_h).float()
    wx = wx * (cols[None, :] < box_geometry[:, 1:2]).float()
    return torch.cat((gy, gx, wy, wx), dim=1).contiguous()


def paste_faces(face_bgr: torch.Tensor, base_rgb: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Blend generated faces into the original face regions.

    ``face_bgr``: (N, 3, R, 96) network output in [0, 1], BGR: face rows ``96 - R..95`` (R = 96: the whole
    face; fewer: :mod:`.rows`, where the mask is zero above them). ``base_rgb``: (N, 3, Hc, Wc) uint8
    original box rows ``row0..h``, top-left aligned. ``table``: (N, 2 (Hc + Wc)) rows of :func:`paste_table`
    made with the same first face row.
    Returns (N, Hc, Wc, 3) uint8 RGB; pixels outside an item's region are the base unchanged.
    """
    canvas_h, canvas_w = base_rgb.shape[2], base_rgb.shape[3]
    gy, gx, wy, wx = torch.split(table, [canvas_h, canvas_w, canvas_h, canvas_w], dim=1)
    sampled = F.grid_sample(
        face_bgr.float().flip(1),
        axes_grid(gy, gx),
        mode="bilinear",
        padding_mode="border",
        align_corners=False,
    )
    alpha = (wy[:, :, None] * wx[:, None, :])[:, None]
    # both ends of the blend lie in [0, 255], so the rounded result does too
    out = blend(base_rgb.float(), sampled * 255.0, alpha)
    return out.round_().permute(0, 2, 3, 1).to(torch.uint8, memory_format=torch.contiguous_format)
