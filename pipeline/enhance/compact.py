"""The key layout of Real-ESRGAN's compact net (SRVGGNetCompact), the layout spandrel detects.

``body.0`` is the first 3x3 convolution (3 -> F), ``body.1`` its PReLU (F slopes), then ``num_conv`` pairs
of a 3x3 convolution (F -> F) and a PReLU, and last a 3x3 convolution to ``3 scale^2`` channels that a pixel
shuffle turns into the ``scale`` x larger picture; the nearest-upsampled input is added to it.
``realesr-general-x4v3``: F = 64, 32 body convolutions, x4 (1.21 M parameters); ``realesr-animevideov3``:
F = 64, 16 body convolutions, x4. The published ``.pth`` files wrap the state in ``{"params": ...}``.
"""

from __future__ import annotations

import torch

GENERAL_X4V3 = {"num_feat": 64, "num_conv": 32, "scale": 4}  # realesr-general-x4v3
ANIMEVIDEO_V3 = {"num_feat": 64, "num_conv": 16, "scale": 4}  # realesr-animevideov3


def compact_shapes(
    num_feat: int = 64, num_conv: int = 32, scale: int = 4, channels: int = 3
) -> dict[str, tuple[int, ...]]:
    """Every key of a compact net's state dict and its shape, in order."""
    shapes: dict[str, tuple[int, ...]] = {
        "body.0.weight": (num_feat, channels, 3, 3),
        "body.0.bias": (num_feat,),
        "body.1.weight": (num_feat,),
    }
    for i in range(num_conv):
        conv, act = 2 + 2 * i, 3 + 2 * i
        shapes[f"body.{conv}.weight"] = (num_feat, num_feat, 3, 3)
        shapes[f"body.{conv}.bias"] = (num_feat,)
        shapes[f"body.{act}.weight"] = (num_feat,)
    last = 2 + 2 * num_conv
    shapes[f"body.{last}.weight"] = (channels * scale * scale, num_feat, 3, 3)
    shapes[f"body.{last}.bias"] = (channels * scale * scale,)
    return shapes


def random_compact_state(
    num_feat: int = 64, num_conv: int = 32, scale: int = 4, *, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random weights in the published layout (tests and benchmarks; no real weights are shipped).

    Convolutions get He-style scaled noise, so activations neither vanish nor blow up over 32 layers, and
    PReLU slopes 0.25 (PyTorch's default)."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for key, shape in compact_shapes(num_feat, num_conv, scale).items():
        if key.endswith(".bias"):
            state[key] = torch.randn(shape, generator=generator) * 0.01
        elif len(shape) == 1:  # a PReLU's slopes
            state[key] = torch.full(shape, 0.25)
        else:
            fan_in = shape[1] * shape[2] * shape[3]
            state[key] = torch.randn(shape, generator=generator) * (1.0 / fan_in) ** 0.5
    return state
