from __future__ import annotations

import pytest
import torch

from lipcast.pipeline.mouth_warp import (
    BORDER_PX,
    LOWER_EDGE_SAMPLE_PX,
    lip_line_y,
    mouth_fields,
    render_mouths,
)

HEIGHT, WIDTH = 96, 112
# left corner, right corner, lip_y, chin_y (ROI coordinates): a slight smile, like the astronaut's.
GEOMETRY = torch.tensor([[35.0, 22.5, 76.0, 23.0, 30.5, 59.0]])


def textured_rois(batch: int = 1, seed: int = 0) -> torch.Tensor:
    """``(B, 3, H, W)`` in [0, 255]: skin-like colour with a smooth random texture and a bright teeth band."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand(batch, 3, HEIGHT // 8, WIDTH // 8, generator=generator)
    texture = torch.nn.functional.interpolate(noise, size=(HEIGHT, WIDTH), mode="bilinear")
    skin = torch.tensor([205.0, 160.0, 140.0])[None, :, None, None]
    rois = skin + 40.0 * (texture - 0.5)
    rois[:, :, 24:31, 38:74] = 240.0  # teeth above the lip line
    return rois.round()


def params(open_: float, wide: float = 0.0, round_: float = 0.0, batch: int = 1) -> torch.Tensor:
    return torch.tensor([[open_, wide, round_]]).expand(batch, 3).contiguous()


def pixel_grid() -> tuple[torch.Tensor, torch.Tensor]:
    ys = torch.arange(HEIGHT, dtype=torch.float32)[:, None].expand(HEIGHT, WIDTH)
    xs = torch.arange(WIDTH, dtype=torch.float32)[None, :].expand(HEIGHT, WIDTH)
    return xs, ys


def test_lip_line_passes_through_the_corners_and_the_centre() -> None:
    u = torch.tensor([-1.0, 0.0, 1.0]).reshape(1, 1, 3)
    line = lip_line_y(GEOMETRY, u).reshape(-1)
    assert line.tolist() == pytest.approx([22.5, 30.5, 23.0])


def test_zero_params_are_the_identity_exactly() -> None:
    fields = mouth_fields(GEOMETRY, params(0.0), HEIGHT, WIDTH)
    xs, ys = pixel_grid()
    assert torch.equal(fields.source_x[0], xs)
    assert torch.equal(fields.source_y[0], ys)
    assert not fields.gap_alpha.any()
    rois = textured_rois()
    assert torch.equal(render_mouths(rois, GEOMETRY, params(0.0)).round(), rois)


@pytest.mark.parametrize("values", [(1.0, 0.0, 0.0), (1.0, 1.0, 0.0), (0.6, 0.0, 1.0), (1, 1, 1)])
def test_displacement_is_zero_at_the_roi_border(values: tuple[float, float, float]) -> None:
    fields = mouth_fields(GEOMETRY, params(*values), HEIGHT, WIDTH)
    xs, ys = pixel_grid()
    border = torch.ones(HEIGHT, WIDTH, dtype=torch.bool)
    inner = int(BORDER_PX) + 1
    border[inner:-inner, inner:-inner] = False
    assert torch.equal(fields.source_x[0][border], xs[border])
    assert torch.equal(fields.source_y[0][border], ys[border])
    assert not fields.gap_alpha[0][border].any()
    moved = (fields.source_y[0] - ys).abs().max()
    assert moved > 5.0  # ... while the jaw does drop inside


def test_the_warp_never_folds() -> None:
    fields = mouth_fields(GEOMETRY, params(1.0, 1.0, 0.0), HEIGHT, WIDTH)
    source_y = fields.source_y[0]
    line = lip_line_y(GEOMETRY, (fields.source_x - 55.5) / 20.5)[0]
    # Rows that sample below the lower lip's edge (the gap itself is painted over) keep their order.
    below = source_y > line + LOWER_EDGE_SAMPLE_PX + 1e-3
    both_below = below[1:] & below[:-1]
    steps_y = source_y[1:] - source_y[:-1]
    assert both_below.sum() > 1000
    assert (steps_y[both_below] > 0).all()
    steps_x = fields.source_x[0][:, 1:] - fields.source_x[0][:, :-1]
    assert (steps_x > 0).all()


def test_opening_darkens_the_mouth_and_deepens_with_open() -> None:
    rois = textured_rois()
    mouth = (slice(None), slice(None), slice(30, 40), slice(48, 64))  # just below the centre lip line
    brightness = [render_mouths(rois, GEOMETRY, params(v))[mouth].mean().item() for v in (0, 0.5, 1)]
    assert brightness[0] > brightness[1] + 40 > brightness[2] + 40
    half_open = mouth_fields(GEOMETRY, params(0.5), HEIGHT, WIDTH)
    assert half_open.gap_alpha[0, 32, 55] == 1.0
    assert half_open.gap_alpha[0, 28, 55] == 0.0  # the teeth above the lip line stay


def test_wide_pulls_the_corners_out_and_round_pulls_them_in() -> None:
    right_corner = (23, 76)  # (y, x)
    wide = mouth_fields(GEOMETRY, params(0.0, wide=1.0), HEIGHT, WIDTH)
    round_ = mouth_fields(GEOMETRY, params(0.0, round_=1.0), HEIGHT, WIDTH)
    # A backward warp: an outward pull samples the corner from further in.
    assert wide.source_x[0][right_corner] < 76.0 < round_.source_x[0][right_corner]
    left_corner = (22, 35)
    assert wide.source_x[0][left_corner] > 35.0 > round_.source_x[0][left_corner]


def test_batch_items_are_independent() -> None:
    rois = textured_rois(batch=3, seed=4)
    batch_params = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.4, 0.2, 0.7]])
    geometry = GEOMETRY.expand(3, 6)
    together = render_mouths(rois, geometry, batch_params)
    for i in range(3):
        alone = render_mouths(rois[i : i + 1], GEOMETRY, batch_params[i : i + 1])
        torch.testing.assert_close(together[i : i + 1], alone)
