from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.wav2lip.backend import Wav2LipBackend
from lipcast.pipeline.wav2lip.bench import random_items, synthetic_avatar
from lipcast.pipeline.wav2lip.fold import fold_batchnorm
from lipcast.pipeline.wav2lip.fused import fuse_conv_units
from lipcast.pipeline.wav2lip.model import FACE_SIZE_PX, Wav2Lip
from lipcast.pipeline.wav2lip.paste import (
    box_grid,
    face_mask,
    face_mask_profiles,
    first_blended_row,
    paste_faces,
    paste_table,
)
from lipcast.pipeline.wav2lip.rows import (
    crop_features,
    decode_rows,
    first_face_row,
    input_start,
    output_start,
    plan_rows,
)


@pytest.fixture(scope="module")
def model() -> Wav2Lip:
    torch.manual_seed(5)
    net = Wav2Lip()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.8, 1.2)
    return fold_batchnorm(net).eval()


@pytest.fixture(scope="module")
def inputs(model: Wav2Lip) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(6)
    with torch.no_grad():
        embedding = model.encode_audio(torch.randn(3, 1, 80, 16))
        feats = model.encode_face(torch.rand(3, 6, 96, 96))
    return embedding, feats


def test_the_default_mask_needs_rows_47_to_95_and_the_levels_start_lower() -> None:
    assert first_face_row(0.5) == 47
    assert first_face_row(0.0) == 0
    plan = plan_rows(Wav2Lip(), 47)
    assert plan.feature_rows == (46, 22, 10, 4, 1, 0, 0)  # 96, 48, 24, 12, 6, 3, 1 px levels
    assert plan.rows == 49
    assert plan_rows(Wav2Lip(), 0).feature_rows == (0,) * 7


@pytest.mark.parametrize("top_fraction", [0.5, 0.3, 0.05, 0.0, 0.9])
def test_decoding_the_rows_equals_the_full_decoder_there(
    model: Wav2Lip, inputs: tuple[torch.Tensor, list[torch.Tensor]], top_fraction: float
) -> None:
    embedding, feats = inputs
    plan = plan_rows(model, first_face_row(top_fraction))
    with torch.no_grad():
        full = model.decode(embedding, feats)
        rows = decode_rows(model, embedding, crop_features(feats, plan), plan)
    assert rows.shape == (3, 3, FACE_SIZE_PX - plan.first_row, FACE_SIZE_PX)
    torch.testing.assert_close(rows, full[:, :, plan.first_row :], rtol=0, atol=1e-6)


def test_fused_units_plan_the_same_rows(
    model: Wav2Lip, inputs: tuple[torch.Tensor, list[torch.Tensor]]
) -> None:
    fused = fuse_conv_units(model)
    plan = plan_rows(fused, 47)
    assert plan == plan_rows(model, 47)
    embedding, feats = inputs
    with torch.no_grad():
        full = model.decode(embedding, feats)
        rows = decode_rows(fused, embedding, crop_features(feats, plan), plan)
    torch.testing.assert_close(rows, full[:, :, 47:], rtol=0, atol=1e-6)


def test_one_row_fewer_at_any_level_changes_the_output(
    model: Wav2Lip, inputs: tuple[torch.Tensor, list[torch.Tensor]]
) -> None:
    """The plan is tight: starting any cropped level one row later reads padding where a real row was."""
    embedding, feats = inputs
    plan = plan_rows(model, 47)
    blocks = list(model.face_decoder_blocks)
    with torch.no_grad():
        full = model.decode(embedding, feats)[:, :, 47:]
        for level in range(5):  # the cropped levels, 96 px down to 6 px
            rows = list(plan.feature_rows)
            rows[level] += 1
            starts = rows[::-1]  # concatenation starts in decoder order
            outputs = [
                output_start(block, start) for block, start in zip(blocks, [0, *starts[:-1]], strict=True)
            ]
            drops = tuple(start - out for start, out in zip(starts, outputs, strict=True))
            later = replace(plan, feature_rows=tuple(rows), drops=drops, output_drop=47 - starts[-1])
            out = decode_rows(model, embedding, crop_features(feats, later), later)
            assert out.shape == full.shape
            assert (out - full).abs().max() > 1e-5, level  # the exact plan: 0


def test_layers_of_unknown_row_reach_need_their_whole_input() -> None:
    strided = nn.Sequential(nn.Conv2d(4, 4, 3, stride=2, padding=1), nn.ReLU())
    assert input_start(strided, 20) == 0
    same = nn.Sequential(nn.Conv2d(4, 4, 5, padding=2), nn.Conv2d(4, 4, 1))
    assert input_start(same, 20) == 18
    assert output_start(same, 18) == 18
    with pytest.raises(ValueError, match="whole input"):
        output_start(strided, 3)
    with pytest.raises(ValueError):
        plan_rows(Wav2Lip(), 96)


@pytest.mark.parametrize("top_fraction", [0.5, 0.3])
def test_the_rows_grid_never_blends_above_the_decoded_rows(top_fraction: float) -> None:
    first_row = first_face_row(top_fraction)
    mask = face_mask(top_fraction=top_fraction)
    assert not mask[:, :, : first_row + 1].any()
    for height in (20, 47, 96, 150, 720):
        geometry = torch.tensor([[height, 8.0, 0.0]])
        grid = box_grid(geometry, height, 8, first_row)
        sampled = F.grid_sample(mask[:, :, first_row:], grid, align_corners=False)[0, 0, :, 0]
        full = F.grid_sample(mask, box_grid(geometry, height, 8), align_corners=False)[0, 0, :, 0]
        torch.testing.assert_close(sampled, full, rtol=0, atol=1e-5)
        assert torch.all(sampled[: first_blended_row(height, top_fraction)] == 0), height


def _boxes(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    heights, widths = (150, 61, 97), (140, 70, 33)
    geometry = torch.tensor(
        [[h, w, first_blended_row(h)] for h, w in zip(heights, widths, strict=True)], dtype=torch.float32
    )
    canvas_hw = (int(max(h - first_blended_row(h) for h in heights)) + 3, max(widths) + 5)
    base = torch.from_numpy(rng.integers(0, 256, (3, 3, *canvas_hw), dtype=np.uint8))
    return geometry, base, canvas_hw


@pytest.mark.parametrize("first_row", [0, 47])
def test_the_separable_table_is_the_resampled_mask_inside_the_region(first_row: int) -> None:
    geometry, _base, (canvas_h, canvas_w) = _boxes(np.random.default_rng(3))
    table = paste_table(geometry, canvas_h, canvas_w, face_mask_profiles(), first_row)
    _gy, _gx, wy, wx = torch.split(table, (canvas_h, canvas_w, canvas_h, canvas_w), dim=1)
    mask = face_mask()[:, :, first_row:].expand(3, 1, -1, -1)
    resampled = F.grid_sample(
        mask, box_grid(geometry, canvas_h, canvas_w, first_row), padding_mode="border", align_corners=False
    )[:, 0]
    rows = torch.arange(canvas_h)[None, :, None] < (geometry[:, 0] - geometry[:, 2])[:, None, None]
    cols = torch.arange(canvas_w)[None, None, :] < geometry[:, 1, None, None]
    expected = resampled * (rows & cols)
    torch.testing.assert_close(wy[:, :, None] * wx[:, None, :], expected, rtol=0, atol=1e-6)
    assert expected.amax() > 0.99


def test_pasting_the_rows_equals_pasting_the_whole_face() -> None:
    rng = np.random.default_rng(8)
    face = torch.from_numpy(rng.uniform(0, 1, (3, 3, 96, 96)).astype(np.float32))
    geometry, base, canvas_hw = _boxes(rng)
    profiles = face_mask_profiles()
    whole = paste_faces(face, base, paste_table(geometry, *canvas_hw, profiles)).int()
    rows = paste_faces(face[:, :, 47:], base, paste_table(geometry, *canvas_hw, profiles, 47)).int()
    assert (whole - rows).abs().max() <= 1
    assert ((whole - rows) != 0).float().mean() < 0.001
    region_h = (geometry[:, 0] - geometry[:, 2]).int()
    for i in range(3):  # outside its region an item's canvas is the base, untouched
        original = base[i].permute(1, 2, 0).int()
        assert torch.equal(rows[i, region_h[i] :], original[region_h[i] :])
        assert torch.equal(rows[i, :, int(geometry[i, 1]) :], original[:, int(geometry[i, 1]) :])


def test_the_backend_renders_the_same_patches_from_the_rows() -> None:
    torch.manual_seed(9)
    weights = {"state_dict": Wav2Lip().state_dict()}
    avatar = synthetic_avatar(frames=2)
    cropped = Wav2LipBackend(weights, batch_sizes=(1, 2))
    whole = Wav2LipBackend(weights, batch_sizes=(1, 2), crop_rows=False)
    for backend in (cropped, whole):
        backend.add_avatar(avatar)
    assert cropped._feats[0].shape[2:] == (50, 96)  # the 96 px feature from row 46
    assert sum(t[0].numel() for t in cropped._feats) == 163_328
    assert sum(t[0].numel() for t in whole._feats) == 290_816
    items: list[RenderItem] = random_items(avatar, 2, np.random.default_rng(1))
    for a, b in zip(cropped.render(items), whole.render(items), strict=True):
        assert (a.top, a.left) == (b.top, b.left)
        assert np.abs(a.pixels.astype(int) - b.pixels).max() <= 1
