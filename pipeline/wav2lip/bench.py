"""Model benchmarks: eager fp32 full forward against the engine's render path, per batch size.

Random weights and a synthetic avatar (timing does not depend on the weights). Every timing brackets whole
work: ``torch.cuda.synchronize`` before the clock starts and after the work is queued on CUDA, and
:meth:`Wav2LipBackend.render` returns only after its stream has finished and the patches are on the host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.defaults import COMPILE_MODE
from lipcast.pipeline.timing import FPS
from lipcast.pipeline.wav2lip.backend import Wav2LipBackend
from lipcast.pipeline.wav2lip.compile_cache import CompileCache
from lipcast.pipeline.wav2lip.featurizer import CONDITIONING_SHAPE
from lipcast.pipeline.wav2lip.model import FACE_CHANNELS, FACE_SIZE_PX, Wav2Lip

BENCH_FRAME_SIZE_PX = 512  # synthetic avatar frames, square
BENCH_FACE_BOX = (128, 96, 384, 352)  # x1, y1, x2, y2: a 256x256 face
BENCH_AVATAR_FRAMES = 8
WARMUP_ITERS = 3
MODEL_BATCH_SIZES = (1, 8, 32, 128)  # benchmark_model's default sizes


def synthetic_avatar(name: str = "bench", frames: int = BENCH_AVATAR_FRAMES, seed: int = 0) -> Avatar:
    """A noise avatar with one fixed face box (the content does not matter for timing)."""
    rng = np.random.default_rng(seed)
    size = BENCH_FRAME_SIZE_PX
    pixels = rng.integers(0, 256, (frames, size, size, 3), dtype=np.uint8)
    x1, y1, x2, y2 = BENCH_FACE_BOX
    boxes = np.tile(np.array(BENCH_FACE_BOX, dtype=np.int32), (frames, 1))
    mouth = [x1 + 64, y2 - 60, x2 - 64, y2 - 60, y2 - 60, y2 - 10]
    mouths = np.tile(np.array(mouth, dtype=np.float32), (frames, 1))
    return Avatar(name, FPS, pixels, boxes, mouths)


def _time_ms(fn: Callable[[], Any], device: torch.device, iters: int) -> float:
    """Mean wall-clock milliseconds of ``fn`` over ``iters`` runs, after warm-up, fully synchronised."""
    cuda = device.type == "cuda"
    for _ in range(WARMUP_ITERS):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    start_s = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start_s) * 1000.0 / iters


def _decode(model: Wav2Lip, audio: torch.Tensor, feats: list[torch.Tensor]) -> torch.Tensor:
    return model.decode(model.encode_audio(audio), feats)


def _row(config: str, device: torch.device, dtype: torch.dtype, batch: int, ms: float) -> dict[str, Any]:
    return {
        "config": config,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "batch_size": batch,
        "latency_ms": ms,
        "frames_per_s": batch * 1000.0 / ms,
    }


@torch.no_grad()
def benchmark_model(
    device: str | torch.device = "cpu",
    batch_sizes: Sequence[int] = MODEL_BATCH_SIZES,
    iters: int = 10,
    compile_cache: CompileCache | None = None,
    compile_mode: str = COMPILE_MODE,
) -> list[dict[str, Any]]:
    """Time the model per batch size in three configurations; one dict per (config, batch size).

    * ``eager_fp32_full``: the unfolded model's full forward (face encoder included), fp32, inputs on
      the device;
    * ``cached_decode``: the BN-folded model's audio encoder and decoder on cached face features, eager,
      in the engine's dtype and memory format;
    * ``engine_render``: :meth:`Wav2LipBackend.render` (folded BN, cached features, on-device paste,
      host round trip; fp16, channels_last and CUDA graphs on CUDA) with a 256x256 face box;
    * ``engine_render_compiled`` (with ``compile_cache``): the same with the compiled kernels
      (:mod:`.compiled`; the first render of a size builds or loads them, before the timing).

    Keys: config, device, dtype, batch_size, latency_ms, frames_per_s.
    """
    device = torch.device(device)
    rows: list[dict[str, Any]] = []
    model = Wav2Lip().eval().to(device)
    for batch in batch_sizes:
        audio = torch.randn(batch, 1, *CONDITIONING_SHAPE, device=device)
        face = torch.rand(batch, FACE_CHANNELS, FACE_SIZE_PX, FACE_SIZE_PX, device=device)
        ms = _time_ms(partial(model, audio, face), device, iters)
        rows.append(_row("eager_fp32_full", device, torch.float32, batch, ms))
    del model
    backend = Wav2LipBackend(None, device=device, batch_sizes=batch_sizes)
    folded, fmt = backend.model, backend.memory_format
    for batch in batch_sizes:
        audio = torch.randn(batch, 1, *CONDITIONING_SHAPE, device=device, dtype=backend.dtype)
        face = torch.rand(batch, FACE_CHANNELS, FACE_SIZE_PX, FACE_SIZE_PX, device=device)
        feats = folded.encode_face(face.to(backend.dtype).contiguous(memory_format=fmt))
        audio = audio.contiguous(memory_format=fmt)
        ms = _time_ms(partial(_decode, folded, audio, feats), device, iters)
        rows.append(_row("cached_decode", device, backend.dtype, batch, ms))
    avatar = synthetic_avatar()
    backend.add_avatar(avatar)
    rng = np.random.default_rng(0)
    for batch in batch_sizes:
        items = random_items(avatar, batch, rng)
        ms = _time_ms(partial(backend.render, items), device, iters)
        rows.append(_row("engine_render", device, backend.dtype, batch, ms))
    if compile_cache is not None:
        compiled = Wav2LipBackend(
            None,
            device=device,
            batch_sizes=batch_sizes,
            compile_cache=compile_cache,
            compile_mode=compile_mode,
        )
        compiled.add_avatar(avatar)
        for batch in batch_sizes:
            items = random_items(avatar, batch, rng)
            compiled.render(items)  # builds (or loads) the kernels and captures the graph
            ms = _time_ms(partial(compiled.render, items), device, iters)
            config = (
                "engine_render_compiled" if compiled.compiled is not None else "engine_render_compile_failed"
            )
            rows.append(_row(config, device, compiled.dtype, batch, ms))
    return rows


def random_items(avatar: Avatar, batch: int, rng: np.random.Generator) -> list[RenderItem]:
    """``batch`` render requests over the avatar's frames, with random mel windows."""
    windows = rng.uniform(-4, 4, (batch, *CONDITIONING_SHAPE)).astype(np.float32)
    return [RenderItem(avatar.name, i % avatar.frame_count, windows[i]) for i in range(batch)]
