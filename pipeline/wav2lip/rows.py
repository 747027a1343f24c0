"""Decoding only the face rows the paste reads: the lower face, exactly, for about two thirds of the work.

The paste (:mod:`.paste`) blends the generated face into its box with a mask that is zero above face row
``R = floor(96 top_fraction - 0.5) + 1`` (row 48 for the default lower half). A bilinear sample above row
``R - 1`` mixes two zero mask rows, so its alpha is exactly 0 and its colour is never used: only rows
``R - 1 ..95`` of the 96x96 face matter. The decoder's upper rows cost as much as its lower ones, so this
module runs the decoder on the rows those need and nothing above.

Row dependence, from the output back to the cached face features. A stride-1 "same" convolution
(``k = 2p + 1``) on an input that starts at row ``s > 0`` reads its zero padding where the true row ``s - 1``
would be, so its output is exact from ``s + p`` on (from 0 when ``s = 0``: the padding is real there). The
stride-2 transposed convolution of the decoder's up blocks (``k = 3, p = 1``, output padding 1) maps input
row ``i`` to output rows ``2i - 1 .. 2i + 1``; on input rows ``s..`` its output rows ``2s..`` are all exact
(row ``2s`` reads input row ``s`` only). Walking each decoder block backwards gives the first row its input
must start at; the concatenation before it keeps the decoder output from that row and the face feature of the
same level cropped to it (cropped once, when an avatar is added: :func:`crop_features`). Any layer that is
none of these needs its whole input. For the default mask the levels 96, 48, 24, 12, 6 start at rows 46, 22,
10, 4, 1.

Outputs agree with the full decoder's rows from ``first_row`` on to float rounding (same kernels, fewer rows).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lipcast.pipeline.wav2lip.fused import FusedConvUnit
from lipcast.pipeline.wav2lip.model import FACE_SIZE_PX, N_FACE_FEATURES, ConvTransposeUnit, ConvUnit, Wav2Lip

_PASS_THROUGH = (nn.Identity, nn.ReLU, nn.Sigmoid)


def first_face_row(mask_top_fraction: float) -> int:
    """The first 96x96 face row whose pixels can reach the blended patch (``R - 1`` above)."""
    first_mask_row = math.floor(FACE_SIZE_PX * mask_top_fraction - 0.5) + 1
    return max(0, min(FACE_SIZE_PX - 1, first_mask_row - 1))


def _conv_of(unit: nn.Module) -> nn.Module:
    """The convolution inside a conv unit (a plain, folded or fused one), or the module itself."""
    if isinstance(unit, ConvUnit | ConvTransposeUnit):
        return unit.conv_block[0]
    if isinstance(unit, FusedConvUnit):
        return unit.conv
    return unit


def _same_rows_padding(conv: nn.Module) -> int | None:
    """``p`` of a stride-1 convolution whose output row ``o`` reads input rows ``o - p .. o + p``."""
    if not isinstance(conv, nn.Conv2d) or isinstance(conv.padding, str):
        return None
    kernel, stride, pad, dilation = conv.kernel_size[0], conv.stride[0], conv.padding[0], conv.dilation[0]
    return pad if stride == 1 and dilation == 1 and kernel == 2 * pad + 1 else None


def _is_doubling(conv: nn.Module) -> bool:
    """The up blocks' transposed convolution: input row ``i`` -> output rows ``2i - 1 .. 2i + 1``."""
    if not isinstance(conv, nn.ConvTranspose2d):
        return False
    return (
        conv.kernel_size[0] == 3
        and conv.stride[0] == 2
        and conv.padding[0] == 1
        and conv.output_padding[0] == 1
        and conv.dilation[0] == 1
    )


def _units(block: nn.Module) -> list[nn.Module]:
    return list(block.children()) if isinstance(block, nn.Sequential) else [block]


def input_start(units: Iterable[nn.Module], exact_from: int) -> int:
    """The first row an input must start at (exact from there) for the units' output to be exact from
    ``exact_from``; 0 when a unit needs its whole input."""
    need = exact_from
    for unit in reversed(list(units)):
        if isinstance(unit, _PASS_THROUGH):
            continue
        conv = _conv_of(unit)
        pad = _same_rows_padding(conv)
        if pad is not None:
            need = max(0, need - pad)
        elif _is_doubling(conv):
            need //= 2  # output rows 2s.. are exact on input rows s..
        else:
            need = 0
    return need


def output_start(units: Iterable[nn.Module], start: int) -> int:
    """The row of the units' first output row, for an input starting at ``start``."""
    for unit in units:
        conv = _conv_of(unit)
        if isinstance(unit, _PASS_THROUGH) or _same_rows_padding(conv) is not None:
            continue
        if _is_doubling(conv):
            start *= 2
        elif start != 0:
            raise ValueError(f"{type(unit).__name__} needs its whole input")
    return start


@dataclass(frozen=True)
class RowPlan:
    """Where every level of the decoder starts.

    ``feature_rows[k]``: the first row kept of face feature ``k`` (shallowest first, as
    :meth:`Wav2Lip.encode_face` returns them), which is also where the concatenation of that level starts.
    ``drops[i]``: rows cut from the top of decoder block ``i``'s output before its concatenation (rows its
    cropped input could not make exact). The output starts at ``first_row``: ``(N, 3, 96 - first_row, 96)``.
    """

    first_row: int
    feature_rows: tuple[int, ...]
    drops: tuple[int, ...]
    output_drop: int

    @property
    def rows(self) -> int:
        return FACE_SIZE_PX - self.first_row


def plan_rows(model: Wav2Lip, first_row: int) -> RowPlan:
    """The crop of every decoder level for output rows ``first_row..95`` (0: the whole face)."""
    if not 0 <= first_row < FACE_SIZE_PX:
        raise ValueError(f"first_row must be in [0, {FACE_SIZE_PX}), got {first_row}")
    blocks = list(model.face_decoder_blocks)
    starts = [0] * len(blocks)  # the concatenation after block i starts at starts[i]
    need = input_start(_units(model.output_block), first_row)
    for i in range(len(blocks) - 1, -1, -1):
        starts[i] = need
        need = input_start(_units(blocks[i]), need)
    drops = []
    start = 0  # the rows the embedding (1x1) starts at
    for block, concat_start in zip(blocks, starts, strict=True):
        out = output_start(_units(block), start)
        drops.append(concat_start - out)
        start = concat_start
    output_drop = first_row - output_start(_units(model.output_block), start)
    return RowPlan(first_row, tuple(reversed(starts)), tuple(drops), output_drop)


def crop_features(feats: Sequence[torch.Tensor], plan: RowPlan) -> list[torch.Tensor]:
    """The face features as the cropped decoder reads them (same memory format)."""
    if len(feats) != N_FACE_FEATURES:
        raise ValueError(f"expected {N_FACE_FEATURES} face features, got {len(feats)}")
    fmt = torch.channels_last if feats[0].is_contiguous(memory_format=torch.channels_last) else None
    cropped = []
    for feat, row in zip(feats, plan.feature_rows, strict=True):
        part = feat[:, :, row:]
        cropped.append(part.contiguous(memory_format=fmt) if fmt is not None else part.contiguous())
    return cropped


def decode_rows(
    model: Wav2Lip, audio_embedding: torch.Tensor, feats: Sequence[torch.Tensor], plan: RowPlan
) -> torch.Tensor:
    """:meth:`Wav2Lip.decode` on the rows of ``plan``: embedding (N, 512, 1, 1) and the cropped features
    (:func:`crop_features`) -> (N, 3, ``plan.rows``, 96), face rows ``plan.first_row..95``."""
    if len(feats) != N_FACE_FEATURES:
        raise ValueError(f"expected {N_FACE_FEATURES} face features, got {len(feats)}")
    x = audio_embedding
    for block, skip, drop in zip(model.face_decoder_blocks, reversed(feats), plan.drops, strict=True):
        out = block(x)
        x = torch.cat((out[:, :, drop:] if drop else out, skip), dim=1)
    out = model.output_block(x)
    return out[:, :, plan.output_drop :] if plan.output_drop else out
