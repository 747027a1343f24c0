"""Choosing the device and the backend, and describing them (startup diagnostics, health endpoint)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from pipeline.backend import LipSyncBackend

logger = logging.getLogger(__name__)


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


def create_backend(
    name: str,
    device: torch.device,
    *,
    checkpoint: Path | None = None,
    lookahead_ms: float | None = None,
) -> LipSyncBackend:
    """Build the named backend on ``device``."""
    if name == "builtin":
        from pipeline.builtin import BuiltinBackend

        kwargs: dict[str, Any] = {} if lookahead_ms is None else {"lookahead_ms": lookahead_ms}
        return BuiltinBackend(device, **kwargs)
    if name == "wav2lip":
        from pipeline.wav2lip.backend import Wav2LipBackend

        if checkpoint is None:
            raise ValueError("the wav2lip backend needs a checkpoint file")
        return Wav2LipBackend(checkpoint, device=device)
    raise ValueError(f"unknown backend {name!r}")
