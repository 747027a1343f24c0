"""The render budget derived from warm-up timings (CUDA), and the warm-up's steady timings."""

from __future__ import annotations

import pytest
import torch

from lipcast.pipeline.defaults import default_render_budget_ms
from lipcast.pipeline.devices import MIN_RENDER_BUDGET_MS, RENDER_BUDGET_MARGIN_MS, measured_render_budget_ms

TIMINGS = {1: 0.7, 2: 0.8, 4: 0.9, 8: 1.2, 16: 1.7, 32: 2.2, 64: 3.7, 128: 7.0}
SIZES = tuple(TIMINGS)


def test_budget_is_twice_the_bucket_for_max_sessions_plus_margin() -> None:
    assert measured_render_budget_ms(TIMINGS, 4, SIZES) == pytest.approx(2 * 0.9 + RENDER_BUDGET_MARGIN_MS)
    assert measured_render_budget_ms(TIMINGS, 33, SIZES) == pytest.approx(2 * 3.7 + RENDER_BUDGET_MARGIN_MS)
    # More sessions than the largest bucket: the largest bucket's time.
    assert measured_render_budget_ms(TIMINGS, 500, SIZES) == pytest.approx(2 * 7.0 + RENDER_BUDGET_MARGIN_MS)


def test_budget_is_bounded() -> None:
    assert measured_render_budget_ms({1: 0.0}, 1, (1,)) == MIN_RENDER_BUDGET_MS
    assert measured_render_budget_ms({1: 10_000.0}, 1, (1,)) == 400.0
    with pytest.raises(ValueError):
        measured_render_budget_ms({}, 1, (1,))


def test_cpu_keeps_the_fixed_defaults() -> None:
    cpu = torch.device("cpu")
    assert default_render_budget_ms("builtin", cpu) == 40.0
    assert default_render_budget_ms("wav2lip", cpu) == 400.0
