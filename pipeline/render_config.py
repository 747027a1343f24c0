"""What the render side is built from: the server's settings hand this down once (no torch import here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lipcast.pipeline.defaults import COMPILE_MODE


@dataclass(frozen=True)
class RenderConfig:
    """What the render side is built from (the server's ``Settings``, those fields only)."""

    backend: str
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    gpus: tuple[str, ...] = ()  # one engine each; empty: from ``device``
    checkpoint: Path | None = None
    lookahead_ms: float | None = None
    batch_sizes: tuple[int, ...] = ()  # empty: per device (default_batch_sizes)
    render_budget_ms: float | None = None  # None: measured at warm-up on CUDA, the backend's default on a CPU
    max_sessions: int = 4  # frames due per tick at most (sizes the measured budget)
    torch_threads: int | None = None
    wav2lip_alignment: str = "inference"
    wav2lip_compile: str = "auto"
    wav2lip_compile_mode: str = COMPILE_MODE
    compile_cache_dir: Path | None = None
    musetalk_weights: Path | None = None  # the weights directory (pipeline/musetalk/weights.py)
    musetalk_context_s: float = 30.0
    musetalk_floor: str = "running"
    musetalk_decode: str = "rows"
    musetalk_compile: str = "auto"  # auto | on | off, as wav2lip_compile
    face_enhance_weights: Path | None = None  # the sharpen stage's restorer (pipeline/enhance), Wav2Lip only
    avatar_dirs: tuple[Path, ...] = ()  # searched in order: the first avatar of a name wins
    default_avatar: str = ""
    builtin_hd_sizes: tuple[tuple[int, int], ...] = ()  # the built-in avatar also at these (width, height)
