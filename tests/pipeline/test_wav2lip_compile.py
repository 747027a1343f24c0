"""Compiled kernels: the cache key and manifest, the backend's use of a compiler (a stand-in on the CPU, where
a real compile takes minutes), the fallback when compiling fails, and on CUDA the real torch.compile against
the eager fp32 model."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.defaults import COMPILE_MODE
from lipcast.pipeline.devices import resolve_compile
from lipcast.pipeline.wav2lip.backend import Wav2LipBackend
from lipcast.pipeline.wav2lip.compile_cache import (
    MANIFEST_NAME,
    CompileCache,
    CompileKey,
    environment_key,
)
from tests.pipeline.test_wav2lip_backend import make_avatar, mel_window

KEY = CompileKey(gpu="NVIDIA H200", torch="2.11.0", cuda="13.0", triton="3.5.0", dtype="float16")


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    from lipcast.pipeline.wav2lip.model import Wav2Lip

    torch.manual_seed(5)
    return Wav2Lip().state_dict()


@pytest.fixture(scope="module")
def avatar() -> Avatar:
    return make_avatar("alpha", 3, (120, 110), (20, 15, 84, 85), seed=1)


def items(avatar: Avatar, count: int, seed: int = 0) -> list[RenderItem]:
    return [RenderItem(avatar.name, i % avatar.frame_count, mel_window(seed + i)) for i in range(count)]


# -- key and manifest ---------------------------------------------------------------------------------------


def test_key_digest_follows_every_field() -> None:
    assert KEY.digest == CompileKey(**json.loads(json.dumps(KEY.__dict__))).digest
    others = [replace(KEY, gpu="NVIDIA H100"), replace(KEY, torch="2.12.0"), replace(KEY, dtype="float32")]
    assert len({KEY.digest, *(k.digest for k in others)}) == 4
    assert replace(KEY, torch="2.12.0", gpu="NVIDIA H100").differences(KEY) == [
        "gpu NVIDIA H200 -> NVIDIA H100",
        "torch 2.11.0 -> 2.12.0",
    ]


def test_environment_key_on_cpu() -> None:
    key = environment_key(torch.device("cpu"), torch.float32)
    assert (key.gpu, key.torch, key.dtype) == ("cpu", torch.__version__, "float32")


def test_status_hit_partial_and_mismatch(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    empty = cache.status(KEY)
    assert empty.built_sizes == () and empty.mismatch is None and empty.directory.parent == tmp_path
    cache.record(KEY, (4,), build_s=12.0)
    cache.record(KEY, (1, 4))
    status = cache.status(KEY)
    assert status.built_sizes == (1, 4) and status.mismatch is None
    assert status.missing((1, 2, 4)) == (2,)
    manifest = json.loads((status.directory / MANIFEST_NAME).read_text())
    assert manifest["key"]["gpu"] == "NVIDIA H200" and manifest["last_build_s"] == 12.0
    newer = replace(KEY, torch="2.12.0")
    other = cache.status(newer)
    assert other.built_sizes == () and other.directory != status.directory
    assert other.mismatch is not None and "torch 2.11.0 -> 2.12.0" in other.mismatch
    assert "gpu" not in other.mismatch  # only what differs is named
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / MANIFEST_NAME).write_text("not json")  # unreadable manifests are ignored
    assert cache.status(KEY).built_sizes == (1, 4)


def test_has_build_needs_every_size_and_says_why_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = CompileCache(tmp_path)
    with caplog.at_level(logging.INFO):
        assert not cache.has_build(KEY, (1, 2))
    assert "no compiled kernels for batch sizes 1,2" in caplog.text
    cache.record(KEY, (1, 2, 4))
    assert cache.has_build(KEY, (1, 2))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert not cache.has_build(replace(KEY, gpu="NVIDIA H100"), (1,))
    assert "gpu NVIDIA H200 -> NVIDIA H100" in caplog.text


def test_resolve_compile_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    cpu = torch.device("cpu")
    assert resolve_compile("auto", cpu) is False and resolve_compile("off", cpu) is False
    with caplog.at_level(logging.WARNING):
        assert resolve_compile("on", cpu) is False
    assert "need a CUDA device" in caplog.text
    with pytest.raises(ValueError):
        resolve_compile("maybe", cpu)


# -- the backend with a stand-in compiler (CPU) --------------------------------------------------------------


class StandInCompiler:
    """torch.compile's signature; returns the function itself (counting calls), or one that fails."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.options: dict[str, Any] = {}
        self.calls: list[int] = []

    def __call__(self, fn: Callable[..., torch.Tensor], **options: Any) -> Callable[..., torch.Tensor]:
        self.options = options

        def compiled(audio: torch.Tensor, feats: Sequence[torch.Tensor]) -> torch.Tensor:
            self.calls.append(int(audio.shape[0]))
            if self.fail:
                raise RuntimeError("no compiler here")
            return fn(audio, feats)

        return compiled


def assert_same(got: list[RenderedPatch], want: list[RenderedPatch]) -> None:
    for g, w in zip(got, want, strict=True):
        assert (g.top, g.left) == (w.top, w.left)
        np.testing.assert_array_equal(g.pixels, w.pixels)


def test_backend_compiles_bucket_sizes_only(
    tmp_path: Path, weights: dict[str, torch.Tensor], avatar: Avatar, caplog: pytest.LogCaptureFixture
) -> None:
    cache = CompileCache(tmp_path)
    compiler = StandInCompiler()
    with caplog.at_level(logging.INFO):
        backend = Wav2LipBackend(weights, batch_sizes=(1, 2, 4), compile_cache=cache, compiler=compiler)
    assert compiler.options == {"mode": "default", "dynamic": False, "fullgraph": True}
    assert "batch sizes 1,2,4 not built yet" in caplog.text
    plain = Wav2LipBackend(weights, batch_sizes=(1, 2, 4))
    for b in (backend, plain):
        b.add_avatar(avatar)
    for count in (4, 1, 3, 4):  # 3 is not a bucket: eager, never compiled (a new shape = a new compile)
        assert_same(backend.render(items(avatar, count)), plain.render(items(avatar, count)))
    assert compiler.calls == [4, 1, 4]
    assert backend.compiled is not None and set(backend.compiled.compile_s) == {1, 4}
    key = environment_key(torch.device("cpu"), torch.float32)
    assert cache.status(key).built_sizes == (1, 4)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = Wav2LipBackend(weights, batch_sizes=(1, 4), compile_cache=cache, compiler=StandInCompiler())
    assert "holds every batch size" in caplog.text
    assert again.compiled is not None and again.compiled.status.missing((1, 4)) == ()


def test_backend_names_what_differs_from_an_old_cache(
    tmp_path: Path, weights: dict[str, torch.Tensor], caplog: pytest.LogCaptureFixture
) -> None:
    cache = CompileCache(tmp_path)
    here = environment_key(torch.device("cpu"), torch.float32)
    cache.record(replace(here, torch="1.0.0"), (1,))
    with caplog.at_level(logging.WARNING):
        Wav2LipBackend(weights, batch_sizes=(1,), compile_cache=cache, compiler=StandInCompiler())
    lines = [r.getMessage() for r in caplog.records if "another environment" in r.getMessage()]
    assert len(lines) == 1 and f"torch 1.0.0 -> {torch.__version__}" in lines[0]


def test_failed_compile_falls_back_to_eager(
    tmp_path: Path, weights: dict[str, torch.Tensor], avatar: Avatar, caplog: pytest.LogCaptureFixture
) -> None:
    backend = Wav2LipBackend(
        weights, batch_sizes=(1, 2), compile_cache=CompileCache(tmp_path), compiler=StandInCompiler(fail=True)
    )
    plain = Wav2LipBackend(weights, batch_sizes=(1, 2))
    for b in (backend, plain):
        b.add_avatar(avatar)
    with caplog.at_level(logging.WARNING):
        assert_same(backend.render(items(avatar, 2)), plain.render(items(avatar, 2)))
    assert backend.compiled is None and "rendering with eager kernels" in caplog.text
    assert_same(backend.render(items(avatar, 1)), plain.render(items(avatar, 1)))


# -- the real torch.compile on CUDA --------------------------------------------------------------------------


def level_diff(got: list[RenderedPatch], want: list[RenderedPatch]) -> tuple[int, float]:
    diffs = [np.abs(g.pixels.astype(int) - w.pixels) for g, w in zip(got, want, strict=True)]
    return max(int(d.max()) for d in diffs), float(np.mean([d.mean() for d in diffs]))


@pytest.mark.gpu
def test_compiled_render_matches_eager_fp32(
    tmp_path: Path, weights: dict[str, torch.Tensor], avatar: Avatar
) -> None:
    """Tolerance, in uint8 levels of the pasted patch: compiled fp16 against eager fp32 at most 8 levels and
    0.5 on average (what fp16 storage between 50 layers costs; the eager fp16 graphs are held to the same
    in test_wav2lip_backend.py); against the eager fp16 graphs, same precision but other kernels and fusion
    order, at most 2 levels. A wrong kernel or layout moves whole regions by tens of levels."""
    # A benchmark run may point the test at the cache `lipcast engine build` filled (and its mode).
    cache = CompileCache(Path(os.environ.get("LIPCAST_COMPILE_CACHE_DIR") or tmp_path))
    mode = os.environ.get("LIPCAST_WAV2LIP_COMPILE_MODE") or COMPILE_MODE
    sizes = (1, 4)
    compiled = Wav2LipBackend(
        weights, device="cuda", batch_sizes=sizes, compile_cache=cache, compile_mode=mode
    )
    eager16 = Wav2LipBackend(weights, device="cuda", batch_sizes=sizes)
    eager32 = Wav2LipBackend(
        weights, device="cuda", dtype=torch.float32, batch_sizes=sizes, cuda_graphs=False
    )
    for b in (compiled, eager16, eager32):
        b.add_avatar(avatar)
    for count in sizes:
        batch = items(avatar, count, seed=10 * count)
        got = compiled.render(batch)
        worst, mean = level_diff(got, eager32.render(batch))
        assert worst <= 8 and mean <= 0.5, (count, worst, mean)
        worst16, _ = level_diff(got, eager16.render(batch))
        assert worst16 <= 2, (count, worst16)
        assert_same(compiled.render(batch), got)  # replays are deterministic
    assert compiled.compiled is not None, "torch.compile fell back to eager"
    assert set(sizes) <= set(cache.status(compiled.compiled.key).built_sizes)


def test_dynamo_traces_the_network_as_one_graph(
    tmp_path: Path, weights: dict[str, torch.Tensor], avatar: Avatar
) -> None:
    """The real dynamo front end (fullgraph: no graph break) with aot_eager instead of Inductor, which
    would take minutes on a CPU: what Inductor gets on CUDA is this graph."""

    def trace_only(fn: Callable[..., torch.Tensor], **options: Any) -> Callable[..., torch.Tensor]:
        return torch.compile(
            fn, backend="aot_eager", dynamic=options["dynamic"], fullgraph=options["fullgraph"]
        )

    torch._dynamo.reset()
    backend = Wav2LipBackend(
        weights, batch_sizes=(1, 2), compile_cache=CompileCache(tmp_path), compiler=trace_only
    )
    plain = Wav2LipBackend(weights, batch_sizes=(1, 2))
    for b in (backend, plain):
        b.add_avatar(avatar)
    for count in (2, 1):
        got, want = backend.render(items(avatar, count)), plain.render(items(avatar, count))
        assert level_diff(got, want)[0] <= 1
    assert backend.compiled is not None  # no fallback: traced without a graph break
