"""The restorer the user brings: loaded with spandrel (``lipcast[enhance]``), checked once at startup.

spandrel detects the architecture from the file's keys. Accepted: an image-to-image network (spandrel's
``ImageModelDescriptor``) of purpose super-resolution or restoration, RGB in and out, with an integer scale
of 1, 2, 4 or 8. Anything else stops ``lipcast serve`` with the path and the reason
(:class:`EnhanceWeightsError`): a missing file, one that does not load (corrupt, truncated, not a model), one
whose kind spandrel does not know, and a model of another kind (inpainting, a face model such as GFPGAN,
which restores an aligned 512x512 whole face, not the mouth region of a 96 px crop).

spandrel imports torchvision (for two architectures lipcast does not use). torchvision wheels on PyPI are
CUDA builds that do not import next to a CPU build of torch; where torchvision is missing or broken a
stand-in is put in its place for the length of spandrel's import only (:func:`import_spandrel`): the compact
nets need nothing of it.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import torch

SUPPORTED_PURPOSES = ("SR", "Restoration")
SUPPORTED_SCALES = (1, 2, 4, 8)
INSTALL_HINT = "pip install 'lipcast[enhance]'"
UNKNOWN_KEYS = "unsupported kind: spandrel knows no architecture of these keys"


class EnhanceUnavailableError(RuntimeError):
    """spandrel (the ``enhance`` extra) is not installed."""


class EnhanceWeightsError(ValueError):
    """A restorer weights file that cannot be used; the message names the path and the reason."""

    def __init__(self, path: str | PathLike[str], reason: str) -> None:
        super().__init__(f"face-enhance weights {path}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass(frozen=True)
class Restorer:
    """A checked restorer network (on the CPU, float32, eval mode) and what is known of it."""

    model: torch.nn.Module
    scale: int
    architecture: str  # spandrel's name, e.g. "RealESRGAN Compact"
    purpose: str
    parameters: int
    supports_half: bool
    source: str  # the file it came from (or "state dict")

    def describe(self) -> str:
        return (
            f"{self.architecture} x{self.scale} ({self.parameters / 1e6:.2f} M parameters) from {self.source}"
        )


def _unavailable(reason: str) -> Any:
    def call(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError(f"torchvision is not usable here ({reason}); lipcast's restorers do not need it")

    return call


@contextlib.contextmanager
def _torchvision_stand_in(reason: str) -> Iterator[None]:
    """``torchvision.transforms.functional`` as a module whose functions raise, for one import."""
    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == "torchvision"}
    modules = {name: types.ModuleType(name) for name in names}
    functional = modules["torchvision.transforms.functional"]
    modes = {"NEAREST": "nearest", "BILINEAR": "bilinear", "BICUBIC": "bicubic"}
    setattr(functional, "InterpolationMode", enum.Enum("InterpolationMode", modes))  # noqa: B010
    for name in ("rotate", "normalize", "resize", "to_tensor"):
        setattr(functional, name, _unavailable(reason))
    modules["torchvision"].transforms = modules["torchvision.transforms"]  # type: ignore[attr-defined]
    modules["torchvision.transforms"].functional = functional  # type: ignore[attr-defined]
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def import_spandrel() -> types.ModuleType:
    """spandrel, or :class:`EnhanceUnavailableError` naming the extra to install."""
    try:
        return importlib.import_module("spandrel")
    except ModuleNotFoundError as e:
        if e.name == "spandrel":
            raise EnhanceUnavailableError(f"the sharpen stage needs spandrel: {INSTALL_HINT}") from e
        if not (e.name or "").startswith("torchvision"):
            raise
        reason = "not installed"
    except (RuntimeError, ImportError, OSError) as e:  # a torchvision built for another torch
        if "torchvision" not in str(e) and "torchvision" not in repr(e.__traceback__):
            raise
        reason = f"{type(e).__name__}: {e}"
    for name in [n for n in sys.modules if n.split(".")[0] == "spandrel"]:
        del sys.modules[name]  # a half-done import
    with _torchvision_stand_in(reason):
        return importlib.import_module("spandrel")


def check_descriptor(descriptor: object, source: str) -> Restorer:
    """A spandrel descriptor -> :class:`Restorer`, or :class:`EnhanceWeightsError` saying why not."""
    spandrel = import_spandrel()
    if not isinstance(descriptor, spandrel.ImageModelDescriptor):
        kind = type(descriptor).__name__
        raise EnhanceWeightsError(source, f"unsupported kind: {kind} is not an image-to-image network")
    architecture = str(descriptor.architecture.name)
    purpose = str(descriptor.purpose)
    if purpose == "FaceSR":
        raise EnhanceWeightsError(
            source,
            f"unsupported kind: {architecture} is a whole-face model (aligned 512x512 input, a face prior);"
            " the sharpen stage restores the mouth region of the crop: bring realesr-general-x4v3.pth",
        )
    if purpose not in SUPPORTED_PURPOSES:
        raise EnhanceWeightsError(
            source,
            f"unsupported kind: {architecture} is a {purpose} model; sharpen needs one of"
            f" {', '.join(SUPPORTED_PURPOSES)}",
        )
    if descriptor.input_channels != 3 or descriptor.output_channels != 3:
        raise EnhanceWeightsError(
            source,
            f"unsupported kind: {descriptor.input_channels} -> {descriptor.output_channels} channels"
            " (sharpen needs RGB in and out)",
        )
    scale = int(descriptor.scale)
    if scale not in SUPPORTED_SCALES:
        raise EnhanceWeightsError(source, f"unsupported scale x{scale} (known: {SUPPORTED_SCALES})")
    model: torch.nn.Module = descriptor.model
    model.eval().requires_grad_(False)
    parameters = sum(p.numel() for p in model.parameters())
    return Restorer(model, scale, architecture, purpose, parameters, bool(descriptor.supports_half), source)


def load_restorer(path: str | PathLike[str]) -> Restorer:
    """Load and check a restorer weights file (``.pth``, ``.safetensors``, ... as spandrel reads them)."""
    path = Path(path)
    if not path.exists():
        raise EnhanceWeightsError(path, "missing: no such file")
    if not path.is_file():
        raise EnhanceWeightsError(path, "not a file")
    spandrel = import_spandrel()
    try:
        descriptor = spandrel.ModelLoader(device="cpu").load_from_file(path)
    except spandrel.UnsupportedModelError as e:
        raise EnhanceWeightsError(path, UNKNOWN_KEYS) from e
    except Exception as e:  # unpickling and safetensors errors of every sort: a corrupt or foreign file
        raise EnhanceWeightsError(path, f"corrupt or unreadable ({type(e).__name__}: {e})") from e
    return check_descriptor(descriptor, str(path))


def restorer_from_state(state: Mapping[str, torch.Tensor], source: str = "state dict") -> Restorer:
    """A restorer from an in-memory state dict (tests, the ncnn converter's output)."""
    spandrel = import_spandrel()
    try:
        descriptor = spandrel.ModelLoader(device="cpu").load_from_state_dict(dict(state))
    except spandrel.UnsupportedModelError as e:
        raise EnhanceWeightsError(source, UNKNOWN_KEYS) from e
    return check_descriptor(descriptor, source)
