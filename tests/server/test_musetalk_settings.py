"""``--backend musetalk``'s settings: the weights directory is required, the flags reach the backend."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lipcast.pipeline.assembly import create_backend
from lipcast.pipeline.musetalk.weights import MuseTalkWeightsError
from lipcast.server.config import Settings
from lipcast.server.flags import parse_settings
from tests.pipeline.musetalk_fixtures import tiny_checkpoint


def test_musetalk_needs_its_weights_and_a_known_decode() -> None:
    with pytest.raises(ValueError, match="--musetalk-weights"):
        Settings(backend="musetalk")
    with pytest.raises(ValueError, match="musetalk_decode"):
        Settings(backend="musetalk", musetalk_weights=Path("w"), musetalk_decode="half")


def test_flags_reach_the_backend(tmp_path: Path) -> None:
    weights = tiny_checkpoint(tmp_path / "w")
    settings = parse_settings(
        [
            "--backend",
            "musetalk",
            "--musetalk-weights",
            str(weights),
            "--musetalk-context-s",
            "10",
            "--musetalk-floor",
            "input",
            "--musetalk-decode",
            "full",
            "--lookahead-ms",
            "120",
        ],
        env={},
    )
    config = settings.render_config()
    backend = create_backend("musetalk", torch.device("cpu"), lookahead_ms=120.0, render_config=config)
    assert backend.lookahead_ms == 120.0 and backend.conditioning_shape == (81, 1002)
    featurizer = backend.new_featurizer()
    assert featurizer.floor == "input" and featurizer.lag_frames == 3
    assert backend.row_plan.full  # type: ignore[attr-defined]


def test_a_missing_weights_directory_names_every_file(tmp_path: Path) -> None:
    config = Settings(backend="musetalk", musetalk_weights=tmp_path).render_config()
    with pytest.raises(MuseTalkWeightsError) as e:
        create_backend("musetalk", torch.device("cpu"), render_config=config)
    assert "musetalkV15/unet.pth" in str(e.value) and "whisper/config.json" in str(e.value)
