"""Compositing on the device: feathered masks and alpha blends, batched, in torch.

Pure tensor code: the same functions run on the CPU and on CUDA. Images are float tensors in [0, 255] or
[0, 1] (the caller's choice, kept consistent), channels first: ``(N, C, H, W)``. Masks are
``(N or 1, 1, H, W)`` in [0, 1], 1 where the patch wins.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from lipcast.pipeline.backend import RenderedPatch
from lipcast.pipeline.easing import smoothstep


def feathered_box_profiles(
    height: int,
    width: int,
    feather_px: float,
    *,
    top_fraction: float = 0.0,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The row and column factors ``(height,)`` and ``(width,)`` of :func:`feathered_box_mask` (it is their
    outer product)."""
    if feather_px <= 0:
        raise ValueError("feather_px must be positive")
    ys = torch.arange(height, device=device, dtype=dtype) + 0.5
    xs = torch.arange(width, device=device, dtype=dtype) + 0.5
    top = top_fraction * height
    wy = smoothstep(top, top + feather_px, ys) * smoothstep(height, height - feather_px, ys)
    wx = smoothstep(0.0, feather_px, xs) * smoothstep(width, width - feather_px, xs)
    return wy, wx


def feathered_box_mask(
    height: int,
    width: int,
    feather_px: float,
    *,
    top_fraction: float = 0.0,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """A ``(1, 1, height, width)`` mask: 1 inside, ramping to 0 over ``feather_px`` at every edge.

    ``top_fraction`` moves the top edge down to that fraction of the height (0.5 keeps the lower half, the
    part of a face that lip-sync changes); the ramp then starts there.
    """
    wy, wx = feathered_box_profiles(
        height, width, feather_px, top_fraction=top_fraction, device=device, dtype=dtype
    )
    return (wy[:, None] * wx[None, :])[None, None]


def blend(base: torch.Tensor, patch: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``base * (1 - mask) + patch * mask``, broadcasting the mask over channels and batch."""
    return torch.lerp(base, patch, mask)


def paste_patch(base: npt.NDArray[np.uint8], patch: RenderedPatch, mix: float = 1.0) -> npt.NDArray[np.uint8]:
    """On the host: a copy of ``base`` (H, W, 3) with ``patch`` written at its place, over it with weight
    ``mix`` (1: replace; below 1: a crossfade toward ``base``)."""
    frame = base.copy()
    pixels = patch.at_box_size()
    h, w = pixels.shape[:2]
    region = frame[patch.top : patch.top + h, patch.left : patch.left + w]
    if mix >= 1.0:
        region[:] = pixels
    elif mix > 0.0:
        blended = region + (pixels.astype(np.float32) - region) * np.float32(mix)
        region[:] = (blended + 0.5).astype(np.uint8)
    return frame
