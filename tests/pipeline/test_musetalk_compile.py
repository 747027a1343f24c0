"""MuseTalk's compiled kernels on a CPU (a stand-in for torch.compile: a real compile takes minutes): which
functions are compiled with which options, that the buckets use them and other sizes do not, the manifest,
the fallback when compiling fails, and the settings that turn it on."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, Avatar, load_avatar
from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.musetalk.backend import MuseTalkBackend
from lipcast.pipeline.musetalk.compiled import CACHE_SUBDIR, musetalk_cache
from lipcast.pipeline.wav2lip.compile_cache import MANIFEST_NAME, environment_key
from tests.pipeline.musetalk_fixtures import fresh_tiny_models


class StandIn:
    """torch.compile's signature: returns the function (recording each call's batch size) or a failing one."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.options: list[dict[str, Any]] = []
        self.calls: list[int] = []

    def __call__(self, fn: Callable[..., torch.Tensor], **options: Any) -> Callable[..., torch.Tensor]:
        self.options.append(options)

        def compiled(latents: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            self.calls.append(int(latents.shape[0]))
            if self.fail:
                raise RuntimeError("inductor exploded")
            return fn(latents, *rest)

        return compiled


@pytest.fixture(scope="module")
def avatar() -> Avatar:
    return load_avatar(BUILTIN_AVATAR_DIR / "astronaut")


def items(backend: MuseTalkBackend, avatar: Avatar, count: int) -> list[RenderItem]:
    cond = backend.speech_conditioning(0.6)
    return [RenderItem(avatar.name, i % avatar.frame_count, cond) for i in range(count)]


def make(avatar: Avatar, tmp_path: Path | None, compiler: StandIn | None) -> MuseTalkBackend:
    cache = None if tmp_path is None else musetalk_cache(tmp_path)
    backend = MuseTalkBackend(
        models=fresh_tiny_models(), batch_sizes=(1, 2), compile_cache=cache, compiler=compiler
    )
    backend.add_avatar(avatar)
    return backend


def test_buckets_render_through_the_compiled_unet_and_decode(avatar: Avatar, tmp_path: Path) -> None:
    compiler = StandIn()
    backend = make(avatar, tmp_path, compiler)
    plain = make(avatar, None, None)
    # the UNet step and the row decode, one specialised graph per bucket, the configured mode
    assert compiler.options == [{"mode": "default", "dynamic": False, "fullgraph": True}] * 2
    got, expected = backend.render(items(backend, avatar, 2)), plain.render(items(plain, avatar, 2))
    for a, b in zip(got, expected, strict=True):
        assert np.array_equal(a.pixels, b.pixels) and (a.top, a.left) == (b.top, b.left)
    assert compiler.calls == [2, 2]  # the UNet, then the decode
    backend.render(items(backend, avatar, 3))  # not a bucket: eager
    assert compiler.calls == [2, 2]
    key = environment_key(backend.device, backend.dtype, "default")
    manifest = json.loads((tmp_path / CACHE_SUBDIR / key.digest / MANIFEST_NAME).read_text())
    assert manifest["built_sizes"] == [2] and manifest["key"]["dtype"] == "float32"
    assert backend.compiled is not None and set(backend.compiled.compile_s) == {2}
    # the fp16 check and its hooks never reach the compiled functions
    calls = len(compiler.calls)
    backend.check_fp16()
    assert len(compiler.calls) == calls


def test_a_failed_compile_falls_back_to_eager(
    avatar: Avatar, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make(avatar, tmp_path, StandIn(fail=True))
    plain = make(avatar, None, None)
    with caplog.at_level(logging.WARNING):
        got = backend.render(items(backend, avatar, 1))
    assert backend.compiled is None and "rendering with eager kernels" in caplog.text
    assert np.array_equal(got[0].pixels, plain.render(items(plain, avatar, 1))[0].pixels)


def test_the_setting_reaches_the_backend(tmp_path: Path) -> None:
    from lipcast.pipeline.assembly import _compile_cache_dir
    from lipcast.pipeline.render_config import RenderConfig

    config = RenderConfig(backend="musetalk", musetalk_compile="on", compile_cache_dir=tmp_path)
    assert _compile_cache_dir(config, torch.device("cpu"), (1, 2)) is None  # a CPU renders eager
    off = RenderConfig(backend="musetalk", musetalk_compile="off", compile_cache_dir=tmp_path)
    assert _compile_cache_dir(off, torch.device("cpu"), (1, 2)) is None
    with pytest.raises(ValueError):
        _compile_cache_dir(
            RenderConfig(backend="musetalk", musetalk_compile="sometimes"), torch.device("cpu"), ()
        )
