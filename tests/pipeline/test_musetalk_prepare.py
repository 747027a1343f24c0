"""``lipcast avatar prepare --backend musetalk``: the cache is written, then used when the avatar is added."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lipcast.cli import main
from lipcast.pipeline.avatar import load_avatar
from lipcast.pipeline.musetalk.backend import MuseTalkBackend
from lipcast.pipeline.musetalk.cache import read_cache
from lipcast.pipeline.musetalk.weights import find_weights
from tests.pipeline.face_media import drawn_face_frames, encode_video
from tests.pipeline.musetalk_fixtures import tiny_checkpoint


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("musetalk"))


def test_prepare_writes_the_cache_the_backend_reads(
    weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    video = encode_video(tmp_path / "face.mp4", drawn_face_frames(8))
    out = tmp_path / "avatars"
    argv = ["avatar", "prepare", str(video), "--name", "mt", "--out", str(out), "--backend", "musetalk"]
    assert main(argv) == 2 and "--musetalk-weights" in capsys.readouterr().err
    assert main([*argv, "--musetalk-weights", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (out / "mt").exists()  # nothing prepared with unusable weights
    assert main([*argv, "--musetalk-weights", str(weights)]) == 0
    assert "musetalk cache" in capsys.readouterr().out
    avatar = load_avatar(out / "mt")
    fingerprint = find_weights(weights).fingerprint()
    cached = read_cache(avatar, fingerprint, "mean")
    assert cached is not None and cached.latents.shape == (avatar.frame_count, 8, 32, 32)
    backend = MuseTalkBackend(weights, batch_sizes=(1,))
    with caplog.at_level("INFO"):
        backend.add_avatar(avatar)
    assert "encoding" not in caplog.text  # the cache was used
    encoded = backend.models.vae  # and it matches what the backend would compute
    from lipcast.pipeline.musetalk.cache import compute_assets

    with torch.no_grad():
        fresh = compute_assets(avatar, encoded, "mean")
    assert torch.allclose(fresh.latents, cached.latents, atol=2e-3)
