from __future__ import annotations

import torch

from lipcast.pipeline.wav2lip.gather import gather_rows

CL = torch.channels_last


def test_gathered_rows_equal_index_select_and_stay_channels_last() -> None:
    table = torch.randn(10, 64, 6, 6).contiguous(memory_format=CL)
    rows = torch.tensor([3, 1, 3, 9])
    out = gather_rows(table, rows)
    assert torch.equal(out, table.index_select(0, rows))
    assert out.is_contiguous(memory_format=CL)
    assert not table.index_select(0, rows).is_contiguous(memory_format=CL)  # what the plain gather gives


def test_other_layouts_gather_as_index_select() -> None:
    rows = torch.tensor([0, 2])
    for table in (
        torch.randn(4, 3, 5, 5),
        torch.randn(4, 512, 1, 1).contiguous(memory_format=CL),
        torch.randn(4, 3),
    ):
        out = gather_rows(table, rows)
        assert torch.equal(out, table.index_select(0, rows)) and out.is_contiguous()
