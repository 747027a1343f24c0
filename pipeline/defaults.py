"""The defaults that several layers share: backend names, batch sizes, the render budget.

Settings left to "auto" (``lipcast.server.config.Settings``) are resolved from these once the device is known
(``lipcast.pipeline.assembly.assemble``); the tools and the pipeline's own constructors fall back on the same
values. Kept free of torch so that the configuration can import it cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lipcast.pipeline.timing import FRAME_MS

if TYPE_CHECKING:
    import torch

BUILTIN = "builtin"
WAV2LIP = "wav2lip"
MUSETALK = "musetalk"  # lipcast[musetalk]: pipeline/musetalk/
BACKENDS = (BUILTIN, WAV2LIP, MUSETALK)
DEFAULT_BACKEND = BUILTIN

# torch.compile modes of the Wav2Lip kernels: fusion only (the default), or every convolution autotuned
# (builds far longer).
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
COMPILE_MODE = COMPILE_MODES[0]
CUDA_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
CPU_BATCH_SIZES = (1, 2, 4, 8)
# MuseTalk: ~0.8 TFLOP a frame; 64 frames a batch take ~0.25 s on an H100 already
MUSETALK_CUDA_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)

RENDER_BUDGET_MS = FRAME_MS  # one frame: the built-in backend, and Wav2Lip on a GPU, render in a few ms
# Wav2Lip on a CPU takes ~45 ms a frame alone and ~30 ms a frame in batches of 8: it keeps up with 25 fps
# only when frames can wait to be batched.
CPU_WAV2LIP_RENDER_BUDGET_MS = 400.0


def default_batch_sizes(device: torch.device, backend: str = BUILTIN) -> tuple[int, ...]:
    """The engine's batch buckets: up to 128 frames on a GPU (64 for MuseTalk), up to 8 on a CPU (where
    bigger batches only add latency)."""
    if device.type != "cuda":
        return CPU_BATCH_SIZES
    return MUSETALK_CUDA_BATCH_SIZES if backend == MUSETALK else CUDA_BATCH_SIZES


def default_render_budget_ms(backend: str, device: torch.device) -> float:
    """How long a frame may take from submission to presentation before it is replaced (when not measured
    from the warm-up: see ``lipcast.pipeline.devices.measured_render_budget_ms``)."""
    if backend in (WAV2LIP, MUSETALK) and device.type != "cuda":
        return CPU_WAV2LIP_RENDER_BUDGET_MS
    return RENDER_BUDGET_MS
