"""``lipcast engine build`` on a CPU host, and the compile settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from lipcast.cli import main
from lipcast.server.flags import parse_settings


def test_engine_build_on_cpu_has_nothing_to_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["engine", "build", "--device", "cpu", "--compile-cache-dir", str(tmp_path / "cache")])
    assert rc == 0
    assert "nothing to build on cpu" in capsys.readouterr().out
    assert not (tmp_path / "cache").exists()  # nothing written


def test_engine_build_without_cuda_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    assert main(["engine", "build", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_compile_settings(tmp_path: Path) -> None:
    settings = parse_settings([], env={})
    assert settings.wav2lip_compile == "auto" and settings.compile_cache_dir is None
    settings = parse_settings(["--wav2lip-compile", "off", "--compile-cache-dir", str(tmp_path)], env={})
    assert settings.wav2lip_compile == "off" and settings.compile_cache_dir == tmp_path
    env = {"LIPCAST_WAV2LIP_COMPILE": "on", "LIPCAST_COMPILE_CACHE_DIR": str(tmp_path)}
    settings = parse_settings([], env=env)
    assert settings.wav2lip_compile == "on" and settings.compile_cache_dir == tmp_path
    with pytest.raises(ValueError, match="wav2lip_compile"):
        parse_settings([], env={"LIPCAST_WAV2LIP_COMPILE": "sometimes"})
