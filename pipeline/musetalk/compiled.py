"""Compiled kernels for MuseTalk's networks: ``torch.compile`` of the UNet step and the row decode, per batch
size (issue 29's "a compile cache").

What is compiled is the per-frame network work on a gathered batch,

    face = decode_rows(vae, unet(latents, 0, context).sample, plan)  # (N,8,32,32), (N,50,384) -> (N,3,R,256)

as two graphs (the UNet; the decode) in the :class:`~lipcast.pipeline.wav2lip.compile_cache.CompileKey`'s
mode, one specialised pair per bucket (``dynamic=False``, as for Wav2Lip). ``per_size=False`` makes the
batch dimension symbolic (``mark_dynamic``) for every bucket from 2 up, so that one build would serve them
all; on the GPU device (torch 2.11, diffusers 0.42.1) that build failed in Inductor ("not simple sympy
type"), so it is not the default. Inductor fuses what eager runs as separate
kernels around cuDNN's convolutions: each GroupNorm with its SiLU and the residual adds (the decoder's
GroupNorms at 128-256 px are most of its memory traffic). Inductor's own CUDA graphs are never used: the
backend captures these kernels inside its graph per bucket, together with whisper, the gathers and the blend,
which stay eager (their shapes follow the avatar tables, which change at run time).

The kernels are cached in ``<compile cache root>/musetalk/<environment digest>`` (the Wav2Lip backend's
:class:`~lipcast.pipeline.wav2lip.compile_cache.CompileCache`, its manifest listing the sizes built), so that
a second start loads them instead of building them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lipcast.pipeline.musetalk.decode import RowPlan, decode_rows
from lipcast.pipeline.wav2lip.compile_cache import CompileCache, CompileKey
from lipcast.pipeline.wav2lip.compiled import BuildBook, Compiler

CACHE_SUBDIR = "musetalk"


def musetalk_cache(root: Path) -> CompileCache:
    """MuseTalk's cache under the compile cache root (its manifest apart from Wav2Lip's)."""
    return CompileCache(Path(root) / CACHE_SUBDIR)


class CompiledNetworks(BuildBook):
    """The compiled UNet step and row decode of one model pair, dtype and row plan, with the cache's
    bookkeeping (:class:`~lipcast.pipeline.wav2lip.compiled.BuildBook`: a size is recorded in the manifest
    once its first call, the build or the load, returned).

    ``compiler`` replaces ``torch.compile`` (tests: a real compile on a CPU takes many minutes)."""

    def __init__(
        self,
        unet: Any,
        vae: Any,
        plan: RowPlan,
        key: CompileKey,
        cache: CompileCache,
        batch_sizes: Sequence[int],
        *,
        compiler: Compiler | None = None,
        per_size: bool = True,
    ) -> None:
        super().__init__(
            "musetalk", key, cache, batch_sizes, "a start with --musetalk-compile on builds them"
        )
        self.per_size = per_size

        def unet_step(latents: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
            # timestep: (1,), the same for every item
            return unet(latents, timestep.expand(latents.shape[0]), encoder_hidden_states=context).sample

        def decode(latents: torch.Tensor) -> torch.Tensor:
            return decode_rows(vae, latents, plan)

        compile_fn: Compiler = compiler or torch.compile
        dynamic = False if per_size else None  # None: what mark_dynamic says
        self._unet = compile_fn(unet_step, mode=key.mode, dynamic=dynamic, fullgraph=True)
        self._decode = compile_fn(decode, mode=key.mode, dynamic=dynamic, fullgraph=True)

    def _run(self, latents: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self._decode(self._unet(latents, timestep, context))

    def __call__(self, latents: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """(N, 8, 32, 32) latents, (1,) timestep, (N, 50, D) contexts -> (N, 3, R, 256) faces."""
        size = int(latents.shape[0])
        if self.seen(size):
            return self._run(latents, timestep, context)
        if size > 1 and not self.per_size:
            _mark_batch_dynamic(latents, context)
        return self.first_call(size, latents.device, lambda: self._run(latents, timestep, context))


def _mark_batch_dynamic(*tensors: torch.Tensor) -> None:
    import torch._dynamo

    for tensor in tensors:
        torch._dynamo.mark_dynamic(tensor, 0, min=2)
