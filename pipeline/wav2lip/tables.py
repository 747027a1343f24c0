"""The Wav2Lip backend's avatar tables, host side (pure numpy).

Every avatar frame is one row of the backend's global device tables (cached face features, face-box pixels,
geometry); an avatar holds a contiguous run of rows (:class:`AvatarEntry`). This module computes what an
avatar adds to the tables (:func:`face_canvas`) and which rows a batch reads (:func:`batch_rows`); the
backend (:mod:`.backend`) owns the device tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import Avatar, UnknownAvatarError
from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.wav2lip.featurizer import CONDITIONING_SHAPE
from lipcast.pipeline.wav2lip.paste import first_blended_row

CANVAS_MULTIPLE_PX = 8


@dataclass
class AvatarEntry:
    offset: int  # first row in the global tables
    count: int
    boxes: npt.NDArray[np.int32]  # (T, 4) padded x1, y1, x2, y2
    first_rows: npt.NDArray[np.int32]  # (T,) first box row of each frame's patch


@dataclass(frozen=True)
class FaceCanvas:
    """What one avatar adds to the tables: its frames' blendable face-box regions on a shared canvas."""

    first_rows: npt.NDArray[np.int32]  # (T,) first box row the blend can change
    canvas_hw: tuple[int, int]  # the shared canvas, grown to hold this avatar's regions too
    base: npt.NDArray[np.uint8]  # (T, Hc, Wc, 3) RGB: each region in its canvas's top-left corner
    geometry: npt.NDArray[np.float32]  # (T, 3): box height, box width, first row


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def face_canvas(
    avatar: Avatar, boxes: npt.NDArray[np.int32], mask_top_fraction: float, canvas_hw: tuple[int, int]
) -> FaceCanvas:
    """The regions of ``avatar``'s padded face ``boxes`` that the blend can change (from
    :func:`.paste.first_blended_row`), on a canvas at least ``canvas_hw`` (rounded up to 8 px)."""
    heights, widths = boxes[:, 3] - boxes[:, 1], boxes[:, 2] - boxes[:, 0]
    first_rows = np.array([first_blended_row(int(h), mask_top_fraction) for h in heights], dtype=np.int32)
    grown = (
        max(canvas_hw[0], _round_up(int((heights - first_rows).max()), CANVAS_MULTIPLE_PX)),
        max(canvas_hw[1], _round_up(int(widths.max()), CANVAS_MULTIPLE_PX)),
    )
    base = np.zeros((avatar.frame_count, *grown, 3), dtype=np.uint8)
    for i, ((x1, y1, x2, y2), row0) in enumerate(zip(boxes, first_rows, strict=True)):
        base[i, : y2 - y1 - row0, : x2 - x1] = avatar.frames[i, y1 + row0 : y2, x1:x2]
    geometry = np.stack((heights, widths, first_rows), axis=1).astype(np.float32)
    return FaceCanvas(first_rows, grown, base, geometry)


def batch_rows(
    avatars: Mapping[str, AvatarEntry],
    items: Sequence[RenderItem],
    conditioning_shape: tuple[int, ...] = CONDITIONING_SHAPE,
) -> tuple[npt.NDArray[np.int64], list[AvatarEntry]]:
    """The table row of every item, and its avatar's entry; unknown avatars, frames and bad conditioning
    (not ``conditioning_shape``) raise."""
    rows = np.empty(len(items), dtype=np.int64)
    entries = []
    for i, item in enumerate(items):
        entry = avatars.get(item.avatar)
        if entry is None:
            raise UnknownAvatarError(f"the backend has no avatar {item.avatar!r}")
        if not 0 <= item.frame_index < entry.count:
            raise IndexError(f"avatar {item.avatar!r} has no frame {item.frame_index}")
        if item.conditioning.shape != conditioning_shape:
            raise ValueError(f"conditioning must be {conditioning_shape}, got {item.conditioning.shape}")
        rows[i] = entry.offset + item.frame_index
        entries.append(entry)
    return rows, entries


def remove_entry(avatars: dict[str, AvatarEntry], name: str) -> AvatarEntry:
    """Drop ``name``'s entry and move the avatars after it up by its row count; returns the entry."""
    entry = avatars.pop(name, None)
    if entry is None:
        raise UnknownAvatarError(f"the backend has no avatar {name!r}")
    for other in avatars.values():
        if other.offset > entry.offset:
            other.offset -= entry.count
    return entry
