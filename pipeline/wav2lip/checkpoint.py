"""Loading Wav2Lip generator checkpoints (kept apart from the pure network in :mod:`.model`).

The published files are ``torch.save`` dicts ``{'state_dict', 'optimizer', 'global_step', 'global_epoch'}``
written by torch 1.1 in the legacy (non-zip) format; they load with ``weights_only=True``. Keys saved from an
``nn.DataParallel`` model carry a ``module.`` prefix, which is stripped. A bare state dict is accepted too.
Every key and shape is checked against the architecture before ``load_state_dict(strict=True)`` so that a
wrong file fails with a readable message instead of a wall of tensor sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from typing import Any

import torch

from lipcast.pipeline.wav2lip.model import Wav2Lip

StateDict = dict[str, torch.Tensor]
STATE_DICT_KEY = "state_dict"
DATA_PARALLEL_PREFIX = "module."
MAX_LISTED_KEYS = 8  # longer key lists in error messages end with "... and N more"


class CheckpointError(ValueError):
    """A checkpoint file is unreadable or does not hold a Wav2Lip generator."""


def _listing(keys: list[str]) -> str:
    shown = ", ".join(keys[:MAX_LISTED_KEYS])
    more = len(keys) - MAX_LISTED_KEYS
    return f"{shown}, ... and {more} more" if more > 0 else shown


def _strip_prefix(key: str) -> str:
    while key.startswith(DATA_PARALLEL_PREFIX):
        key = key[len(DATA_PARALLEL_PREFIX) :]
    return key


def extract_state_dict(payload: Any, source: str = "checkpoint") -> StateDict:
    """The generator state dict inside a loaded checkpoint, ``module.`` prefixes stripped.

    Accepts ``{'state_dict': {...}, ...}`` or a bare ``{name: tensor}`` mapping.
    """
    if not isinstance(payload, Mapping):
        raise CheckpointError(f"{source} holds a {type(payload).__name__}, not a dict")
    state = payload.get(STATE_DICT_KEY, payload)
    if not isinstance(state, Mapping) or not state:
        raise CheckpointError(f"{source}: {STATE_DICT_KEY!r} is not a non-empty dict")
    out: StateDict = {}
    not_tensors = []
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            not_tensors.append(str(key))
            continue
        out[_strip_prefix(str(key))] = value
    if not_tensors:
        raise CheckpointError(
            f"{source} has no {STATE_DICT_KEY!r} entry and is not a bare state dict "
            f"(non-tensor entries: {_listing(sorted(not_tensors))}); a generator checkpoint "
            "(wav2lip.pth / wav2lip_gan.pth, about 416 MiB) is expected"
        )
    return out


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """Every state_dict key of the generator and its shape (built on the meta device, no memory used)."""
    with torch.device("meta"):
        model = Wav2Lip()
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def check_state_dict(state_dict: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Raise :class:`CheckpointError` naming missing, unexpected and mis-shaped keys, if any."""
    problems = state_dict_problems(expected_shapes(), state_dict)
    if problems:
        raise CheckpointError(f"{source} does not match the Wav2Lip generator: " + "; ".join(problems))


def state_dict_problems(
    expected: Mapping[str, tuple[int, ...]], state_dict: Mapping[str, torch.Tensor]
) -> list[str]:
    """Missing, unexpected and mis-shaped keys of ``state_dict`` against ``expected`` shapes, as phrases."""
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    misshaped = [
        f"{key} {tuple(state_dict[key].shape)} != {shape}"
        for key, shape in expected.items()
        if key in state_dict and tuple(state_dict[key].shape) != shape
    ]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} keys: {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} keys: {_listing(unexpected)}")
    if misshaped:
        problems.append(f"{len(misshaped)} mis-shaped keys: {_listing(misshaped)}")
    return problems


def load_checkpoint(path: str | PathLike[str], map_location: str | torch.device = "cpu") -> StateDict:
    """Read a generator checkpoint (zip or legacy format) and return its checked state dict.

    Uses ``torch.load(..., weights_only=True)``: no code from the file is run.
    """
    source = str(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError as e:
        raise CheckpointError(f"checkpoint {source} does not exist") from e
    except Exception as e:  # torch.load raises many types on a bad file (UnpicklingError, IndexError, ...)
        raise CheckpointError(f"cannot read checkpoint {source}: {e}") from e
    state_dict = extract_state_dict(payload, source)
    check_state_dict(state_dict, source)
    return state_dict


def load_wav2lip(
    source: str | PathLike[str] | Mapping[str, torch.Tensor] | None,
    map_location: str | torch.device = "cpu",
) -> Wav2Lip:
    """A :class:`Wav2Lip` in eval mode from a checkpoint path, a state dict, or ``None`` (random weights).

    A mapping may be a raw checkpoint dict (with ``'state_dict'``) or a state dict; either is checked.
    """
    model = Wav2Lip()
    if source is not None:
        if isinstance(source, Mapping):
            state_dict = extract_state_dict(source, "state dict")
            check_state_dict(state_dict, "state dict")
        else:
            state_dict = load_checkpoint(source, map_location)
        try:
            model.load_state_dict(state_dict, strict=True)
        except RuntimeError as e:  # dtype problems the shape check cannot see
            raise CheckpointError(f"cannot load the state dict: {e}") from e
    return model.eval()
