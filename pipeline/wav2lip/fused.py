"""Folded conv units as single cuDNN calls on CUDA: convolution + bias (+ residual add) + ReLU.

After :func:`~lipcast.pipeline.wav2lip.fold.fold_batchnorm` a
:class:`~lipcast.pipeline.wav2lip.model.ConvUnit` is a convolution with bias, an optional residual add of its
input and a ReLU: three kernels in eager mode, two of them full passes over the activation.
``torch.cudnn_convolution_relu`` and ``torch.cudnn_convolution_add_relu`` do all of it in one cuDNN call. On a
CPU, or when the convolution has forward hooks (:mod:`.range_check` watches every convolution's output), the
unit runs as before.

``torch.compile`` can trace the fused units once :func:`register_fake_kernels` has given the two ops their
shape functions (torch has none): Inductor then calls them as external kernels and fuses what lies between
them (the transposed convolutions' bias and ReLU, the skip concatenations).
"""

from __future__ import annotations

import copy
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from lipcast.pipeline.wav2lip.model import ConvUnit

ModuleT = TypeVar("ModuleT", bound=nn.Module)
_fakes_registered = False


class FusedConvUnit(nn.Module):
    """A folded :class:`ConvUnit` (its BatchNorm already an ``nn.Identity``)."""

    def __init__(self, unit: ConvUnit) -> None:
        super().__init__()
        conv = unit.conv_block[0]
        if not isinstance(conv, nn.Conv2d) or not isinstance(unit.conv_block[1], nn.Identity):
            raise ValueError("fuse a BN-folded ConvUnit")
        padding = conv.padding
        if conv.bias is None or conv.padding_mode != "zeros" or isinstance(padding, str):
            raise ValueError("the fused call needs a biased, zero-padded convolution")
        self.conv = conv
        self.residual = unit.residual
        self._geometry: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int] = (
            tuple(conv.stride),
            tuple(padding),
            tuple(conv.dilation),
            conv.groups,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.conv
        if x.is_cuda and not conv._forward_hooks:  # a hooked conv (the fp16 range check) runs as a module
            stride, padding, dilation, groups = self._geometry
            if self.residual:
                return torch.cudnn_convolution_add_relu(
                    x, conv.weight, x, 1.0, conv.bias, stride, padding, dilation, groups
                )
            return torch.cudnn_convolution_relu(x, conv.weight, conv.bias, stride, padding, dilation, groups)
        out = conv(x)
        if self.residual:
            out = out + x
        return F.relu(out)


def fuse_conv_units(model: ModuleT) -> ModuleT:
    """A copy of a BN-folded model with every :class:`ConvUnit` replaced by a :class:`FusedConvUnit`."""
    fused = copy.deepcopy(model)
    for parent in list(fused.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, ConvUnit):
                setattr(parent, name, FusedConvUnit(child))
    return fused


def register_fake_kernels() -> None:
    """Shape functions for ``cudnn_convolution_relu`` and ``cudnn_convolution_add_relu`` (once per
    process): the output of the plain convolution, in its memory format."""
    global _fakes_registered
    if _fakes_registered:
        return

    @torch.library.register_fake("aten::cudnn_convolution_relu")
    def _conv_relu(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        stride: list[int],
        padding: list[int],
        dilation: list[int],
        groups: int,
    ) -> torch.Tensor:
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @torch.library.register_fake("aten::cudnn_convolution_add_relu")
    def _conv_add_relu(
        x: torch.Tensor,
        weight: torch.Tensor,
        z: torch.Tensor,
        alpha: float | None,
        bias: torch.Tensor | None,
        stride: list[int],
        padding: list[int],
        dilation: list[int],
        groups: int,
    ) -> torch.Tensor:
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    _fakes_registered = True
