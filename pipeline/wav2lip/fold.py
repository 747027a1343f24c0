"""BatchNorm folding for inference.

In eval mode a BatchNorm2d after a convolution is an affine map per output channel,

    y = gamma * (conv(x) + b - running_mean) / sqrt(running_var + eps) + beta,

so it can be merged into the convolution: ``w' = w * s`` and ``b' = (b - running_mean) * s + beta`` with
``s = gamma / sqrt(running_var + eps)`` applied along the *output*-channel axis of the weight. That axis is
dim 0 for ``Conv2d`` weights ``(cout, cin, kh, kw)`` and dim 1 for ``ConvTranspose2d`` weights
``(cin, cout, kh, kw)`` (groups = 1). The fold is computed in float64 and cast back.
"""

from __future__ import annotations

import copy
from typing import TypeVar

import torch
from torch import nn

ModuleT = TypeVar("ModuleT", bound=nn.Module)


@torch.no_grad()
def fold_conv_bn(conv: nn.Conv2d | nn.ConvTranspose2d, bn: nn.BatchNorm2d) -> None:
    """Fold ``bn`` (running statistics) into ``conv`` in place. ``conv`` gets a bias if it had none."""
    if conv.groups != 1:
        raise ValueError("folding grouped convolutions is not supported")
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("BatchNorm without running statistics cannot be folded")
    out_axis = 1 if isinstance(conv, nn.ConvTranspose2d) else 0
    weight = conv.weight.double()
    mean = bn.running_mean.double()
    scale = torch.rsqrt(bn.running_var.double() + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.double()
    shift = -mean * scale
    if bn.bias is not None:
        shift = shift + bn.bias.double()
    shape = [1] * weight.dim()
    shape[out_axis] = -1
    folded_weight = weight * scale.view(shape)
    bias = conv.bias.double() if conv.bias is not None else torch.zeros_like(mean)
    folded_bias = bias * scale + shift
    conv.weight.copy_(folded_weight.to(conv.weight.dtype))
    if conv.bias is None:
        conv.bias = nn.Parameter(folded_bias.to(conv.weight.dtype))
    else:
        conv.bias.copy_(folded_bias.to(conv.bias.dtype))


def fold_batchnorm(model: ModuleT) -> ModuleT:
    """A copy of ``model`` in eval mode with every Conv/ConvT -> BatchNorm2d pair in a Sequential folded.

    The BatchNorm is replaced by ``nn.Identity``, so the copy has fewer state_dict keys; the original is
    untouched. Outputs agree with ``model.eval()`` to float rounding (~1e-6 relative in fp32).
    """
    folded = copy.deepcopy(model).eval()
    for module in folded.modules():
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.children())
        for i in range(len(children) - 1):
            conv, bn = children[i], children[i + 1]
            if isinstance(conv, nn.Conv2d | nn.ConvTranspose2d) and isinstance(bn, nn.BatchNorm2d):
                fold_conv_bn(conv, bn)
                module[i + 1] = nn.Identity()
    return folded
