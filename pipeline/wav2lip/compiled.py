"""Compiled kernels for the render path: ``torch.compile`` of the audio encoder + decoder, per batch size.

What is compiled is the per-frame network work on cached face features,

    face = decode_rows(model, model.encode_audio(mel), feats, plan)  # (N,1,80,16), 7 feats -> (N,3,R,96)

with ``dynamic=False`` (one specialised graph per batch size, the engine's fixed buckets) in mode
:data:`~lipcast.pipeline.defaults.COMPILE_MODE` (``default``: Inductor fuses the bias, residual adds, ReLUs
and the skip concatenations around the cuDNN convolutions) or ``max-autotune-no-cudagraphs`` (also autotunes
every convolution, cuDNN against its Triton templates; builds far longer). Inductor's own CUDA graphs are
never used: the backend captures the compiled kernels inside its own graph per bucket (together with the
gather of the cached features and the paste). The gather and the paste stay eager code inside that graph:
their shapes follow the avatar tables and the canvas, which change at run time (an uploaded avatar), and a
recompile then would stall the engine.

Compiling happens on a batch size's first call, in the backend's warm-up before its graph is captured.
With a warm :mod:`.compile_cache` that first call loads the kernels instead of building them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from lipcast.pipeline.wav2lip.compile_cache import CacheStatus, CompileCache, CompileKey
from lipcast.pipeline.wav2lip.fused import register_fake_kernels
from lipcast.pipeline.wav2lip.model import Wav2Lip
from lipcast.pipeline.wav2lip.rows import RowPlan, decode_rows

logger = logging.getLogger(__name__)

DecodeFn = Callable[[torch.Tensor, Sequence[torch.Tensor]], torch.Tensor]
Compiler = Callable[..., Any]  # torch.compile's signature: (fn, *, mode, dynamic, fullgraph) -> fn


def compile_available(device: torch.device) -> bool:
    """Whether torch.compile can build GPU kernels here: a CUDA device and Triton importable."""
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def raise_recompile_limit(needed: int) -> None:
    """One graph per batch size (and dtype) of the same code: dynamo's per-code limit must allow them all."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(int(getattr(config, name)), needed))


T = TypeVar("T")


class BuildBook:
    """The bookkeeping of compiled kernels per batch size in one cache: the start's line on what the cache
    holds, and each size's first call (the build or the load) timed, logged and recorded in the manifest.

    ``label`` names the network in the log lines (``wav2lip``, ``musetalk``); ``build_hint`` says how to
    build ahead of time. Sets ``TORCHINDUCTOR_CACHE_DIR``: Inductor's FX graph, autotuning and Triton
    caches all follow it (read when used; process-wide by Inductor's design, so one process keeps one
    compile cache)."""

    def __init__(
        self, label: str, key: CompileKey, cache: CompileCache, batch_sizes: Sequence[int], build_hint: str
    ) -> None:
        self.label, self.key, self.cache = label, key, cache
        self.batch_sizes = tuple(batch_sizes)
        self.status: CacheStatus = cache.status(key)
        self.compile_s: dict[int, float] = {}  # first call (compile or cache load) per size
        self._seen: set[int] = set()
        status, missing = self.status, self.status.missing(self.batch_sizes)
        if status.mismatch is not None:
            logger.warning(
                "%s; compiling anew into %s (minutes; %s)", status.mismatch, status.directory, build_hint
            )
        elif not missing:
            logger.info("compile cache %s holds every batch size: loading kernels", status.directory)
        else:
            logger.info(
                "compile cache %s: batch sizes %s not built yet, compiling them at warm-up (minutes; %s)",
                status.directory,
                ",".join(map(str, missing)),
                build_hint,
            )
        status.directory.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(status.directory)
        raise_recompile_limit(2 * len(self.batch_sizes) + 4)

    def seen(self, size: int) -> bool:
        return size in self._seen

    def first_call(self, size: int, device: torch.device, run: Callable[[], T]) -> T:
        """``run()``, the first call of batch ``size``: timed (to the GPU's end), logged, recorded."""
        position = self.batch_sizes.index(size) + 1 if size in self.batch_sizes else 0
        cached = size in self.status.built_sizes
        logger.info(
            "%s: %s compiled kernels of batch %d (%d/%d)",
            self.label,
            "loading" if cached else "building",
            size,
            position,
            len(self.batch_sizes),
        )
        start_s = time.perf_counter()
        out = run()
        if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize(device)
        elapsed_s = time.perf_counter() - start_s
        self._seen.add(size)
        self.compile_s[size] = elapsed_s
        self.cache.record(self.key, (size,), None if cached else elapsed_s)
        logger.info("%s: batch %d compiled kernels ready in %.1f s", self.label, size, elapsed_s)
        return out


class CompiledDecoder(BuildBook):
    """The compiled ``decode_rows(encode_audio(mel), feats)`` of one model, dtype and row plan (:mod:`.rows`),
    with its cache bookkeeping (:class:`BuildBook`).

    ``compiler`` is ``torch.compile`` (tests pass a stand-in: a real compile on a CPU takes minutes).
    Sizes are recorded in the cache manifest once their first call (the compile) has returned.
    """

    def __init__(
        self,
        model: Wav2Lip,
        key: CompileKey,
        cache: CompileCache,
        batch_sizes: Sequence[int],
        plan: RowPlan,
        *,
        compiler: Compiler | None = None,
    ) -> None:
        super().__init__("wav2lip", key, cache, batch_sizes, "`lipcast engine build` does it ahead of time")
        register_fake_kernels()  # the model's conv units may be fused ones

        def decode(audio: torch.Tensor, feats: Sequence[torch.Tensor]) -> torch.Tensor:
            return decode_rows(model, model.encode_audio(audio), feats, plan)

        compile_fn: Compiler = compiler or torch.compile
        self._fn: DecodeFn = compile_fn(decode, mode=key.mode, dynamic=False, fullgraph=True)

    def __call__(self, audio: torch.Tensor, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        size = int(audio.shape[0])
        if self.seen(size):
            return self._fn(audio, feats)
        return self.first_call(size, audio.device, lambda: self._fn(audio, feats))
