"""The VAE decoder run only on the face rows the blend mask reads (spec 4.3; issue 29's "decode only the
latent rows the blend mask uses").

The mask is zero above the face crop's centre row (row 128 of 256), so only the lower rows of the decoded
face reach the frame. ``post_quant_conv``, ``conv_in`` and the mid block (whose attention sees the whole
latent) run on all 32x32 latent rows; each up block then runs on the rows its output needs, plus its
receptive field: a 3x3 convolution needs one row more above, a nearest x2 upsampling half the rows. The walk
backwards from the first face row needed (:func:`plan_rows`) gives each stage's first input row; rows
computed above a crop's top edge read zero padding there, so each stage keeps exactly the margin that makes
the rows it hands on independent of them.

What is not exact: the GroupNorm layers of the up blocks average over the rows present, which are fewer
than in a full decode. :func:`decode_full` is the reference; docs/musetalk.md states the measured difference
and ``--musetalk-decode full`` decodes everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lipcast.pipeline.musetalk.config import FACE_SIZE, SCALING_FACTOR

DEFAULT_FIRST_FACE_ROW = 120  # the mask starts at row 128; the bilinear resize to the box reads row 127


@dataclass(frozen=True)
class RowPlan:
    """First row of each up block's input (at its resolution) and of the final output (at 256)."""

    block_rows: tuple[int, ...]
    out_row: int  # first face row the decode returns (rows out_row .. 255)

    @property
    def full(self) -> bool:
        return self.out_row == 0


def _convs(block: Any) -> int:
    return 2 * len(block.resnets)


def plan_rows(decoder: Any, first_face_row: int) -> RowPlan:
    """Walk the decoder backwards from ``first_face_row`` (0: decode everything)."""
    if first_face_row <= 0:
        return RowPlan(tuple(0 for _ in decoder.up_blocks), 0)
    need = first_face_row - 1  # conv_out
    rows = []
    for block in reversed(decoder.up_blocks):
        if block.upsamplers is not None:
            need = (need - 1) // 2  # its conv, then the nearest x2 upsampling
        need = max(0, need - _convs(block))
        rows.append(need)
    return RowPlan(tuple(reversed(rows)), first_face_row)


def decode_full(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """(B, 4, 32, 32) scaled latents -> (B, 3, 256, 256) in [-1, 1] (unclamped), the whole face."""
    return vae.decode(latents / SCALING_FACTOR).sample


def decode_rows(vae: Any, latents: torch.Tensor, plan: RowPlan) -> torch.Tensor:
    """(B, 4, 32, 32) scaled latents -> (B, 3, 256 - plan.out_row, 256): face rows ``out_row .. 255``."""
    if plan.full:
        return decode_full(vae, latents)
    decoder = vae.decoder
    sample = vae.post_quant_conv(latents / SCALING_FACTOR)
    sample = decoder.conv_in(sample)
    sample = decoder.mid_block(sample, None)
    top = 0  # the absolute row (at the current resolution) of sample's row 0
    for block, first in zip(decoder.up_blocks, plan.block_rows, strict=True):
        sample = sample[:, :, first - top :]
        top = first
        sample = block(sample, None)
        if block.upsamplers is not None:
            top *= 2
    sample = sample[:, :, plan.out_row - 1 - top :]  # conv_out's one row above
    sample = decoder.conv_norm_out(sample)
    sample = decoder.conv_act(sample)
    sample = decoder.conv_out(sample)
    return sample[:, :, 1:]


def face_rows_needed(first_face_row: int) -> int:
    return FACE_SIZE - max(0, first_face_row)
