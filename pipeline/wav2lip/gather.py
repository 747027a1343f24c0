"""Gathering rows of the backend's device tables without changing their memory format.

``index_select`` returns a tensor in the default (NCHW-contiguous) format whatever its input's, so gathering
rows of a channels_last table and handing them to channels_last convolutions costs a strided copy per
table (seven face features per render). Gathering from the table's NHWC view instead gives an NHWC-contiguous
result, which viewed back as NCHW is channels_last already: one copy, the gather itself.
"""

from __future__ import annotations

import torch


def gather_rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``table.index_select(0, rows)`` in ``table``'s memory format (channels_last stays channels_last)."""
    if (
        table.dim() == 4
        and table.is_contiguous(memory_format=torch.channels_last)
        and not table.is_contiguous()
    ):
        return table.permute(0, 2, 3, 1).index_select(0, rows).permute(0, 3, 1, 2)
    return table.index_select(0, rows)


def rows_without(offset: int, count: int, total: int, device: torch.device) -> torch.Tensor:
    """The table rows ``0 .. total - 1`` but ``offset .. offset + count - 1`` (an avatar that goes), on
    ``device``."""
    return torch.cat((torch.arange(offset), torch.arange(offset + count, total))).to(device)
