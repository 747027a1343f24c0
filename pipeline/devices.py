"""Choosing the devices, the CPU threads and the render budget, and describing them (startup, /healthz)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lipcast.pipeline.defaults import WAV2LIP

logger = logging.getLogger(__name__)

# On CUDA the budget comes from the warm-up timings instead (measured_render_budget_ms): a frame may find
# the batch before it still running and then needs its own, so twice the bucket's time, plus the hand-offs
# between the event loop and the engine thread (GIL, wake-ups) that the warm-up cannot see.
RENDER_BUDGET_MARGIN_MS = 10.0
MIN_RENDER_BUDGET_MS = 10.0
MAX_MEASURED_RENDER_BUDGET_MS = 400.0


def resolve_device(spec: str = "auto") -> torch.device:
    """``auto`` -> the first CUDA device when there is one, else the CPU."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        logger.warning("CUDA is not available: the engine runs on the CPU (fp32)")
        return torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {spec!r} requested but CUDA is not available")
    return device


def resolve_devices(spec: str = "auto", gpus: Sequence[str] | None = None) -> list[torch.device]:
    """The devices that get an engine each.

    ``gpus`` (``--gpus 0,1``): those, a bare number meaning that CUDA device (any torch device string is
    taken as it is; two ``cpu`` entries give two CPU engines, which tests use). Otherwise ``spec`` as in
    :func:`resolve_device`, except that ``cuda`` or ``auto`` on a host with several GPUs means all of them.
    """
    if gpus:
        names = [g.strip() for g in gpus]
        devices = [torch.device("cuda", int(g)) if g.isdigit() else torch.device(g) for g in names]
        if any(d.type == "cuda" for d in devices):
            if not torch.cuda.is_available():
                raise RuntimeError(f"GPUs {list(gpus)} requested but CUDA is not available")
            count = torch.cuda.device_count()
            missing = [str(d) for d in devices if d.type == "cuda" and (d.index or 0) >= count]
            if missing:
                raise RuntimeError(f"no such GPU: {', '.join(missing)} ({count} visible)")
        return devices
    device = resolve_device(spec)
    if device.type == "cuda" and spec in ("auto", "cuda") and torch.cuda.device_count() > 1:
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    if device.type == "cuda" and device.index is None:
        # An engine's thread makes its device current: "cuda" alone names the one current here and now.
        device = torch.device("cuda", torch.cuda.current_device())
    return [device]


def device_report(device: torch.device) -> dict[str, Any]:
    """Versions and switches that decide performance; logged at startup and shown on /healthz."""
    report: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
        if not torch.backends.cudnn.is_available():
            logger.warning("cuDNN is not available: convolutions will be slow")
    return report


def measured_render_budget_ms(
    timings_ms: Mapping[int, float], max_sessions: int, batch_sizes: Sequence[int]
) -> float:
    """The render budget on CUDA from the warm-up's per-bucket render times (ms).

    At most ``max_sessions`` frames are due per tick, so the batch that holds them is the bucket for
    ``max_sessions`` (the largest when none holds them all); a frame waits for at most one such batch in
    flight, then renders in the next: ``2 x t(bucket) + RENDER_BUDGET_MARGIN_MS``, kept between
    :data:`MIN_RENDER_BUDGET_MS` and :data:`MAX_MEASURED_RENDER_BUDGET_MS`.
    """
    sizes = sorted(size for size in batch_sizes if size in timings_ms)
    if not sizes:
        raise ValueError("no warm-up timing for any batch size")
    bucket = next((size for size in sizes if size >= max_sessions), sizes[-1])
    budget = 2.0 * timings_ms[bucket] + RENDER_BUDGET_MARGIN_MS
    return min(MAX_MEASURED_RENDER_BUDGET_MS, max(MIN_RENDER_BUDGET_MS, budget))


# On a CPU the render thread shares the cores with the media clock, encoders and network: it runs at a lower
# priority so that a busy machine delays renders (repeated frames) rather than the media (stalls, gaps).
CPU_RENDER_NICENESS = 10


def render_niceness(device: torch.device) -> int:
    """The render engine thread's niceness: lowered on a CPU, left alone on a GPU (where it only launches)."""
    return CPU_RENDER_NICENESS if device.type == "cpu" else 0


def configure_threads(backend: str, device: torch.device, requested: int | None = None) -> int:
    """Set torch's CPU thread count: the built-in backend's renders are tiny (a thread each is fastest, and
    the cores stay free for video encoding); Wav2Lip on a CPU needs every core. Returns the count."""
    if requested is None:
        requested = (os.cpu_count() or 1) if (backend == WAV2LIP and device.type == "cpu") else 1
    torch.set_num_threads(max(1, requested))
    return torch.get_num_threads()


COMPILE_CHOICES = ("auto", "on", "off")


def resolve_compile(choice: str, device: torch.device) -> bool:
    """``--wav2lip-compile``: ``auto`` compiles on CUDA when Triton is there; ``on`` asks for it (a CPU or a
    missing Triton gets a warning and eager kernels: compiling Wav2Lip for a CPU takes minutes and gains
    little); ``off`` never compiles."""
    from lipcast.pipeline.wav2lip.compiled import compile_available

    if choice not in COMPILE_CHOICES:
        raise ValueError(f"wav2lip compile must be one of {', '.join(COMPILE_CHOICES)}, got {choice!r}")
    if choice == "off":
        return False
    available = compile_available(device)
    if choice == "on" and not available:
        logger.warning(
            "compiled kernels (--wav2lip-compile or --musetalk-compile on) need a CUDA device with Triton"
            " (%s here): eager kernels",
            device.type,
        )
    return available
