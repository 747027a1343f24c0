"""Pasting generated 96x96 faces back into their face boxes, batched on the device.

Boxes differ in size, so every item is resampled into a fixed ``(canvas_h, canvas_w)`` canvas whose top-left
``(h, w)`` corner is the item's box; the rest of the canvas is ignored by the caller. Resampling uses
``grid_sample`` (bilinear, border padding, align_corners=False) with the grid ``2 (x + 0.5) / w - 1``, which
is the half-pixel mapping of ``cv2.resize(..., INTER_LINEAR)``. The lower-face blend mask is drawn once in
96x96 face space (:func:`pipeline.compositing.feathered_box_mask`) and resampled with the face, so its
feather scales with the box. Everything runs in float32 whatever the network's dtype.
"""

from __future__ import annotations

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


def box_grid(box_hw: torch.Tensor, canvas_h: int, canvas_w: int) -> torch.Tensor:
    """Sampling grid ``(N, canvas_h, canvas_w, 2)`` mapping canvas pixels into 96x96 face space.

    ``box_hw``: ``(N, 2)`` float32 box heights and widths in pixels.
    """
    device = box_hw.device
    ys = torch.arange(canvas_h, device=device, dtype=torch.float32) + 0.5
    xs = torch.arange(canvas_w, device=device, dtype=torch.float32) + 0.5
    gy = 2.0 * ys[None, :] / box_hw[:, 0:1] - 1.0  # (N, canvas_h)
    gx = 2.0 * xs[None, :] / box_hw[:, 1:2] - 1.0  # (N, canvas_w)
    n = box_hw.shape[0]
    return torch.stack(
        (gx[:, None, :].expand(n, canvas_h, canvas_w), gy[:, :, None].expand(n, canvas_h, canvas_w)),
        dim=-1,
    )


def paste_faces(
    face_bgr: torch.Tensor,
    base_rgb: torch.Tensor,
    box_hw: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Blend generated faces into the original face regions.

    ``face_bgr``: (N, 3, 96, 96) network output in [0, 1], BGR. ``base_rgb``: (N, 3, Hc, Wc) uint8 original
    box regions, top-left aligned. ``box_hw``: (N, 2) float32. ``mask``: (1, 1, 96, 96) float32.
    Returns (N, Hc, Wc, 3) uint8 RGB; pixels outside an item's box are the base unchanged.
    """
    n, _, canvas_h, canvas_w = base_rgb.shape
    rgba = torch.cat((face_bgr.float().flip(1), mask.expand(n, 1, -1, -1)), dim=1)
    sampled = F.grid_sample(
        rgba,
        box_grid(box_hw, canvas_h, canvas_w),
        mode="bilinear",
        padding_mode="border",
        align_corners=False,
    )
    rows = torch.arange(canvas_h, device=base_rgb.device, dtype=torch.float32)
    cols = torch.arange(canvas_w, device=base_rgb.device, dtype=torch.float32)
    inside = (rows[None, :, None] < box_hw[:, 0, None, None]) & (
        cols[None, None, :] < box_hw[:, 1, None, None]
    )
    alpha = sampled[:, 3:4] * inside[:, None].float()
    out = blend(base_rgb.float(), sampled[:, :3] * 255.0, alpha)
    return out.round_().clamp_(0.0, 255.0).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
