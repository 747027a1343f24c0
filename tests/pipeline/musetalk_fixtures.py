"""Tiny random-weight MuseTalk checkpoints in the published layout (no download, seconds on a CPU)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from lipcast.pipeline.musetalk.config import tiny_configs  # noqa: E402
from lipcast.pipeline.musetalk.weights import MuseTalkModels, random_models, write_checkpoint  # noqa: E402


@lru_cache(maxsize=1)
def tiny_models() -> MuseTalkModels:
    """One set of tiny random networks per test process (callers must not modify them)."""
    return random_models(tiny_configs(), seed=0)


def fresh_tiny_models(seed: int = 0) -> MuseTalkModels:
    return random_models(tiny_configs(), seed=seed)


def tiny_checkpoint(root: Path, *, legacy_vae_keys: bool = True) -> Path:
    """The tiny networks written under ``root`` in the published layout."""
    return write_checkpoint(fresh_tiny_models(), root, legacy_vae_keys=legacy_vae_keys)
