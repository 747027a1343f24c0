"""Where the compiled Wav2Lip kernels are kept between runs, and whether a cache fits this process.

``torch.compile`` (Inductor) keeps what it builds in its own content-addressed caches: the FX graph cache
(the generated code of each graph), the autotuning results of ``max-autotune`` and Triton's compiled
kernels. All of them live under one directory, ``TORCHINDUCTOR_CACHE_DIR``. A later process that compiles
the same graphs on the same software and GPU finds them there and skips code generation and autotuning,
which is what makes a warm start take seconds instead of minutes.

lipcast gives every environment its own such directory, ``<root>/<digest>``, where the digest is over a
:class:`CompileKey` (GPU, torch, CUDA, Triton, dtype, compile mode and the layout version of this cache),
and writes a ``manifest.json`` beside the caches: the key in clear and the batch sizes built so far. A
start compares its key with the manifests under ``root``: a match says which sizes are already built; no
match while other manifests exist gives one line naming what differs (another GPU, another torch), so a
user knows why the start is slow again.

The checkpoint is not in the key: the compiled graphs take the weights as inputs (Inductor lifts module
parameters to graph inputs), so one build serves every checkpoint of the architecture.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from lipcast.pipeline.defaults import COMPILE_MODE

logger = logging.getLogger(__name__)

CACHE_FORMAT = 2  # bump when what lipcast compiles (the graph's boundaries, options) changes; 2: rows.py
MANIFEST_NAME = "manifest.json"
WAV2LIP_BUILD_HINT = "`lipcast engine build` makes them once; --wav2lip-compile on builds them at start"
MUSETALK_BUILD_HINT = "--musetalk-compile on builds them at start"
# "default": Inductor's fusion without autotuning: 45 s for 4 batch sizes on the H200. max-autotune (without
# its CUDA graphs: lipcast captures its own around the kernels) autotunes every convolution: over a minute for
# one batch-128 graph there, unfinished when the run ended; opt-in.


def default_cache_root() -> Path:
    """``~/.cache/lipcast/compile``: the default of ``--compile-cache-dir``."""
    return Path.home() / ".cache" / "lipcast" / "compile"


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(getattr(triton, "__version__", "unknown"))


@dataclass(frozen=True)
class CompileKey:
    """What compiled kernels depend on. Two processes with equal keys can share a cache."""

    gpu: str
    torch: str
    cuda: str | None
    triton: str | None
    dtype: str
    mode: str = COMPILE_MODE
    cache_format: int = CACHE_FORMAT

    @property
    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def differences(self, other: CompileKey) -> list[str]:
        """``name theirs -> ours`` for every field where ``other`` (a cache's key) differs from this one."""
        return [
            f"{f.name} {getattr(other, f.name)} -> {getattr(self, f.name)}"
            for f in fields(self)
            if getattr(other, f.name) != getattr(self, f.name)
        ]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CompileKey:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})


def environment_key(device: torch.device, dtype: torch.dtype, mode: str = COMPILE_MODE) -> CompileKey:
    """This process's key for compiling on ``device`` in ``dtype``."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return CompileKey(
        gpu=gpu,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        triton=_triton_version(),
        dtype=str(dtype).removeprefix("torch."),
        mode=mode,
    )


@dataclass(frozen=True)
class CacheStatus:
    """What a start finds: the directory to use, the sizes already built there, and (when nothing was built
    for this key but a cache for another one exists) the line that says what differs."""

    directory: Path
    built_sizes: tuple[int, ...]
    mismatch: str | None = None

    def missing(self, sizes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(s for s in sizes if s not in self.built_sizes)


class CompileCache:
    """The cache root: one directory per :class:`CompileKey`, each with its manifest."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def directory(self, key: CompileKey) -> Path:
        return self.root / key.digest

    def _read(self, directory: Path) -> dict[str, Any] | None:
        try:
            doc = json.loads((directory / MANIFEST_NAME).read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and isinstance(doc.get("key"), dict) else None

    def status(self, key: CompileKey) -> CacheStatus:
        directory = self.directory(key)
        doc = self._read(directory)
        if doc is not None and CompileKey.from_json(doc["key"]) == key:
            return CacheStatus(directory, tuple(sorted(int(s) for s in doc.get("built_sizes", []))))
        others = []
        if self.root.is_dir():
            for child in self.root.iterdir():
                other = self._read(child) if child != directory else None
                if other is not None:
                    others.append((float(other.get("updated_s", 0.0)), other))
        if not others:
            return CacheStatus(directory, ())
        newest = max(others, key=lambda pair: pair[0])[1]
        theirs = CompileKey.from_json(newest["key"])
        differs = ", ".join(key.differences(theirs)) or "its manifest's format"
        return CacheStatus(
            directory,
            (),
            f"compile cache under {self.root} was built for another environment ({differs}): "
            "its kernels cannot be used here",
        )

    def has_build(
        self,
        key: CompileKey,
        sizes: tuple[int, ...],
        hint: str = WAV2LIP_BUILD_HINT,
    ) -> bool:
        """Whether every one of ``sizes`` was built for ``key``; logs why not (one line, with ``hint``)."""
        status = self.status(key)
        missing = status.missing(sizes)
        if status.mismatch is not None:
            logger.warning(
                "%s; rendering with eager kernels (`lipcast engine build` builds anew)", status.mismatch
            )
        elif missing:
            logger.info(
                "no compiled kernels for batch sizes %s in %s: rendering with eager kernels (%s)",
                ",".join(map(str, missing)),
                status.directory,
                hint,
            )
        return status.mismatch is None and not missing

    def record(self, key: CompileKey, sizes: tuple[int, ...], build_s: float | None = None) -> None:
        """Add ``sizes`` to the manifest of ``key`` (created if needed); written atomically."""
        directory = self.directory(key)
        directory.mkdir(parents=True, exist_ok=True)
        doc = self._read(directory) or {}
        built = sorted({*(int(s) for s in doc.get("built_sizes", [])), *sizes})
        doc.update({"key": asdict(key), "built_sizes": built, "updated_s": time.time()})
        if build_s is not None:
            doc["last_build_s"] = round(build_s, 2)
        tmp = directory / (MANIFEST_NAME + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(directory / MANIFEST_NAME)
