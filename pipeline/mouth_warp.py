"""The built-in mouth animation: an analytic displacement field and a painted mouth interior, in torch.

Pure tensor code, batched, the same on the CPU and on CUDA. Everything works on mouth regions of interest
(ROIs): ``rois`` are ``(B, 3, H, W)`` float RGB in [0, 255]; ``geometry`` is ``(B, 6)`` float, the mouth in
:data:`lipcast.pipeline.avatar.MOUTH_FIELDS` order in ROI pixel coordinates (x = column, y = row, pixel
centres on integers); ``params`` is ``(B, 3)`` float ``[open, wide, round]`` in [0, 1].

The warp is backward: every output pixel samples the ROI at a source position ``(x - dx, y - dy)``.

* The lip line is the parabola through both lip corners and ``lip_y`` at the mouth centre (on a smiling face
  the lower edge of the upper teeth). Above it nothing moves vertically: upper lip and teeth belong to the
  skull.
* Below it the jaw drops by ``open * JAW_DROP_PER_WIDTH * mouth width``. At the lip line the drop follows a
  lens profile ``(1 - u^2)^p`` (zero at the corners, u = +-1), toward the chin a broader jaw profile; below
  the chin it fades out, so the neck is squeezed, not torn.
* Output pixels that would sample above the lip line from below it form the opened gap; it is painted as a
  mouth interior (dark red-brown, darker under the upper teeth and toward the corners, a faint band of lower
  teeth when wide open) with soft edges.
* ``wide`` pulls the corners outward, ``round`` pulls them inward and narrows the opening further.

All displacement is exactly zero within :data:`BORDER_PX` of the ROI border, so pasting the patch back leaves
no seam, and ``params == 0`` reproduces the ROI.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch
import torch.nn.functional as F

from lipcast.pipeline.easing import smoothstep

# Motion, relative to the mouth width (corner to corner) or half-width (centre to corner, "u" units).
JAW_DROP_PER_WIDTH = 0.26  # jaw drop at open = 1
WIDE_CORNER_SHIFT = 0.12  # each corner moves outward by this many half-widths at wide = 1
ROUND_CORNER_SHIFT = 0.2  # ... and inward at round = 1
ROUND_NARROWING = 0.15  # at round = 1 the opening ends this many half-widths inside the (moved) corners
LENS_EXPONENT_SPREAD = 0.9  # opening profile (1 - u^2)^p at round = 0: a flat lens
LENS_EXPONENT_ROUND = 0.55  # ... and at round = 1: nearly an ellipse (p = 0.5)
JAW_PROFILE_U = (1.0, 2.0)  # the chin moves fully within |u| <= 1.0 and not at all beyond |u| = 2.0
CORNER_PULL_FADE_U = (0.8, 2.2)  # the sideways pull fades out between these |u|
PULL_SIGMA_ABOVE_PER_WIDTH = 0.25  # vertical extent of the sideways pull above the lip line ...
PULL_SIGMA_BELOW_PER_WIDTH = 0.45  # ... and below it (Gaussian sigma, in mouth widths)
BORDER_PX = 2.0  # displacement is exactly zero this close to the ROI border ...
BORDER_RAMP_PX = 6.0  # ... and ramps up over this many pixels inside it

# Mouth interior, RGB in [0, 255].
CAVITY_TOP_RGB = (24.0, 8.0, 7.0)  # in the shadow of the upper teeth
CAVITY_BOTTOM_RGB = (112.0, 40.0, 30.0)  # toward the tongue and the lower lip
CAVITY_CORNER_DARKENING = 0.45  # brightness lost toward the corners of the opening
LOWER_TEETH_RGB = (190.0, 176.0, 160.0)
LOWER_TEETH_ALPHA = 0.35  # opacity of the lower-teeth band at open = 1
LOWER_TEETH_OPEN = (0.5, 1.0)  # the band fades in over this range of open
EDGE_SOFTNESS_PX = (-0.5, 1.0)  # the gap's alpha ramps from 0 to 1 over this distance from each edge
MIN_GAP_PX = 1.5  # gaps thinner than this are painted with proportionally less opacity
LOWER_EDGE_SAMPLE_PX = 1.0  # pixels in the gap sample at least this far below the lip line


class MouthFields(NamedTuple):
    """Per-pixel results of :func:`mouth_fields`, each ``(B, H, W)``."""

    source_x: torch.Tensor  # where each output pixel samples the ROI (px)
    source_y: torch.Tensor
    gap_alpha: torch.Tensor  # opacity of the painted mouth interior, in [0, 1]
    gap_depth: torch.Tensor  # 0 at the upper teeth/lip line, 1 at the displaced lower lip
    gap_u: torch.Tensor  # horizontal position in the opening: 0 centre, +-1 at its ends


def _column(values: torch.Tensor) -> torch.Tensor:
    """``(B,)`` -> ``(B, 1, 1)`` for broadcasting against ``(B, H, W)`` maps."""
    return values[:, None, None]


def lip_line_y(geometry: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Lip-line y at horizontal position ``u`` (``(B, H, W)``, -1 left corner, +1 right corner).

    Beyond the corners the line continues straight along the corner-to-corner line.
    """
    left_y, right_y, lip_y = (_column(geometry[:, i]) for i in (1, 3, 4))
    corner_mid_y = (left_y + right_y) / 2.0
    u_inside = u.clamp(-1.0, 1.0)
    return corner_mid_y + (right_y - left_y) / 2.0 * u + (lip_y - corner_mid_y) * (1.0 - u_inside**2)


@lru_cache(maxsize=32)
def border_taper(height: int, width: int, device: torch.device) -> torch.Tensor:
    """``(1, H, W)``: 0 within :data:`BORDER_PX` of the border, 1 from :data:`BORDER_RAMP_PX` further in.

    Cached per size and device: callers must not modify it.
    """
    ys = torch.arange(height, device=device, dtype=torch.float32)
    xs = torch.arange(width, device=device, dtype=torch.float32)
    inner = BORDER_PX + BORDER_RAMP_PX
    ty = smoothstep(BORDER_PX, inner, ys) * smoothstep(height - 1 - BORDER_PX, height - 1 - inner, ys)
    tx = smoothstep(BORDER_PX, inner, xs) * smoothstep(width - 1 - BORDER_PX, width - 1 - inner, xs)
    return (ty[:, None] * tx[None, :])[None]


def mouth_fields(geometry: torch.Tensor, params: torch.Tensor, height: int, width: int) -> MouthFields:
    """The backward warp and the gap of a batch of mouths; see the module docstring."""
    device = geometry.device
    ys = torch.arange(height, device=device, dtype=torch.float32)[None, :, None]  # (1, H, 1)
    xs = torch.arange(width, device=device, dtype=torch.float32)[None, None, :]  # (1, 1, W)
    taper = border_taper(height, width, device)
    left_x, right_x, chin_y = (_column(geometry[:, i]) for i in (0, 2, 5))
    open_, wide, round_ = (_column(params[:, i]) for i in range(3))
    centre_x = (left_x + right_x) / 2.0
    mouth_width = right_x - left_x
    half_width = mouth_width / 2.0

    # Sideways pull: the mouth stretches about its centre, corners moving by `corner_shift_px`.
    u = (xs - centre_x) / half_width  # (B, 1, W)
    above = ys - lip_line_y(geometry, u)  # (B, H, W), negative above the lip line
    sigma = torch.where(
        above < 0.0,
        PULL_SIGMA_ABOVE_PER_WIDTH * mouth_width,
        PULL_SIGMA_BELOW_PER_WIDTH * mouth_width,
    )
    envelope = torch.exp(-((above / sigma) ** 2))
    corner_shift_px = half_width * (WIDE_CORNER_SHIFT * wide - ROUND_CORNER_SHIFT * round_)
    fade = 1.0 - smoothstep(*CORNER_PULL_FADE_U, u.abs())
    dx = corner_shift_px * u * fade * envelope * taper
    source_x = xs - dx

    # Jaw drop, in the source's horizontal frame (the pull already maps output corners to source corners).
    u_src = (source_x - centre_x) / half_width
    line_y = lip_line_y(geometry, u_src)
    jaw_px = JAW_DROP_PER_WIDTH * mouth_width * open_
    opening_half_u = 1.0 - ROUND_NARROWING * round_
    exponent = LENS_EXPONENT_SPREAD + (LENS_EXPONENT_ROUND - LENS_EXPONENT_SPREAD) * round_
    lens = (1.0 - (u_src / opening_half_u) ** 2).clamp(min=0.0) ** exponent
    gap_px = jaw_px * lens  # opening height of each column
    broad = 1.0 - smoothstep(*JAW_PROFILE_U, u_src.abs())
    lower_lip_y = line_y + gap_px  # output y of the lower lip's upper edge
    toward_chin = smoothstep(lower_lip_y, chin_y + jaw_px, ys, min_width=1e-3)
    profile = lens + (broad - lens) * toward_chin
    below_chin = 1.0 - smoothstep(chin_y + jaw_px, torch.full_like(chin_y, height - 1.0), ys, min_width=1e-3)
    below_line = ys >= line_y
    dy = torch.where(below_line, jaw_px * profile * below_chin, torch.zeros_like(profile)) * taper
    source_y = ys - dy
    # Under the soft lower edge of the gap, sample the lower lip, never the upper teeth above the line.
    lower_lip_floor_y = line_y + LOWER_EDGE_SAMPLE_PX * (gap_px / MIN_GAP_PX).clamp(max=1.0)
    clamped_y = torch.where(below_line, torch.maximum(source_y, lower_lip_floor_y), source_y)

    # The gap: output pixels at or below the lip line that sample from above it.
    from_top_px = ys - line_y
    from_bottom_px = line_y - source_y
    source_y = clamped_y
    gap_alpha = (
        smoothstep(*EDGE_SOFTNESS_PX, from_top_px)
        * smoothstep(*EDGE_SOFTNESS_PX, from_bottom_px)
        * (gap_px / MIN_GAP_PX).clamp(max=1.0)
    )
    gap_depth = (from_top_px / gap_px.clamp(min=1.0)).clamp(0.0, 1.0)
    gap_u = (u_src / opening_half_u).clamp(-1.0, 1.0)
    return MouthFields(source_x, source_y, gap_alpha, gap_depth, gap_u)


@lru_cache(maxsize=8)
def _palette(device: torch.device) -> torch.Tensor:
    """``(3, 1, 3, 1, 1)``: cavity top, cavity bottom and lower-teeth colours (cached per device)."""
    colours = (CAVITY_TOP_RGB, CAVITY_BOTTOM_RGB, LOWER_TEETH_RGB)
    return torch.tensor(colours, device=device)[:, None, :, None, None]


def paint_interior(fields: MouthFields, params: torch.Tensor) -> torch.Tensor:
    """Colour of the mouth interior, ``(B, 3, H, W)`` in [0, 255] (meaningful where ``gap_alpha > 0``)."""
    top, bottom, teeth = _palette(params.device)
    depth = fields.gap_depth[:, None]
    side = fields.gap_u[:, None].abs()
    colour = (top + (bottom - top) * depth) * (1.0 - CAVITY_CORNER_DARKENING * side**2)
    teeth_alpha = (
        LOWER_TEETH_ALPHA
        * smoothstep(*LOWER_TEETH_OPEN, params[:, 0])[:, None, None, None]
        * smoothstep(0.55, 0.85, depth)
        * (1.0 - smoothstep(0.35, 0.7, side))
    )
    return colour + (teeth - colour) * teeth_alpha


def render_mouths(rois: torch.Tensor, geometry: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Animate a batch of mouth ROIs: ``(B, 3, H, W)`` float in [0, 255] -> the same shape and range."""
    _, _, height, width = rois.shape
    fields = mouth_fields(geometry, params, height, width)
    grid = torch.stack(
        (
            fields.source_x * (2.0 / (width - 1)) - 1.0,
            fields.source_y * (2.0 / (height - 1)) - 1.0,
        ),
        dim=-1,
    )
    warped = F.grid_sample(rois, grid, mode="bilinear", padding_mode="border", align_corners=True)
    alpha = fields.gap_alpha[:, None]
    return warped + (paint_interior(fields, params) - warped) * alpha
