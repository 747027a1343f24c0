"""The built-in avatar at HD sizes, made at load time from the 320x320 portrait (no large file shipped).

:func:`scene_avatar` builds a ``width`` x ``height`` avatar (e.g. 1280x720, ``astronaut-720p``): a backdrop
(a vertical gradient of the portrait's own background colour with a soft vignette), the portrait scaled to
the frame's height in the middle, its left and right edges feathered into the backdrop. The face boxes,
mouths and eyes are the portrait's, scaled and moved with it, so every backend and the idle motion
(:mod:`lipcast.pipeline.idle`) work on it as on any prepared avatar of that size.
"""

from __future__ import annotations

import re
from dataclasses import replace

import cv2
import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import Avatar, AvatarError, validate_name

UInt8Array = npt.NDArray[np.uint8]
SIZE_SUFFIX = re.compile(r"^(\d+)x(\d+)$")
FEATHER_FRACTION = 0.12  # of the portrait's width: its side edges fade into the backdrop over this much
VIGNETTE = 0.35  # the backdrop's corners are this much darker than its centre


def scene_name(base: str, height: int) -> str:
    """``astronaut`` at 720 px high -> ``astronaut-720p``."""
    return validate_name(f"{base}-{height}p")


def _backdrop(colour: npt.NDArray[np.float32], width: int, height: int) -> npt.NDArray[np.float32]:
    ys = np.linspace(-1.0, 1.0, height, dtype=np.float32)[:, None]
    xs = np.linspace(-1.0, 1.0, width, dtype=np.float32)[None, :]
    radial = np.clip(1.0 - VIGNETTE * (xs * xs * 0.6 + ys * ys * 0.4), 0.0, 1.0)
    gradient = 0.85 + 0.25 * (1.0 - (ys + 1.0) / 2.0)  # lighter at the top
    return (colour[None, None, :] * (radial * gradient)[:, :, None]).astype(np.float32)


def scene_avatar(avatar: Avatar, width: int, height: int, name: str | None = None) -> Avatar:
    """``avatar`` (every frame) placed on a ``width`` x ``height`` backdrop, scaled to the frame's height."""
    if width % 2 or height % 2 or width < avatar.width or height < avatar.height:
        raise AvatarError(f"a scene of {avatar.name!r} must be even-sized and no smaller than it")
    scale = height / avatar.height
    scaled_w = min(width, round(avatar.width * scale))
    left = (width - scaled_w) // 2
    frames = avatar.frames
    # The backdrop takes the colour of the portrait's top corners (its own background).
    corner = max(2, avatar.height // 16)
    colour = (
        np.concatenate(
            [frames[0, :corner, :corner].reshape(-1, 3), frames[0, :corner, -corner:].reshape(-1, 3)]
        )
        .astype(np.float32)
        .mean(axis=0)
    )
    backdrop = _backdrop(colour, width, height)
    feather = max(2.0, FEATHER_FRACTION * scaled_w)
    xs = np.arange(scaled_w, dtype=np.float32) + 0.5
    weight = np.clip(np.minimum(xs, scaled_w - xs) / feather, 0.0, 1.0)
    weight = (weight * weight * (3.0 - 2.0 * weight))[None, :, None]  # smoothstep
    out = np.empty((avatar.frame_count, height, width, 3), np.uint8)
    for k in range(avatar.frame_count):
        portrait = cv2.resize(frames[k], (scaled_w, height), interpolation=cv2.INTER_CUBIC).astype(np.float32)
        canvas = backdrop.copy()
        region = canvas[:, left : left + scaled_w]
        region += (portrait - region) * weight
        out[k] = np.clip(canvas + 0.5, 0, 255).astype(np.uint8)
    boxes = np.round(avatar.face_boxes.astype(np.float64) * scale).astype(np.int32)
    boxes[:, [0, 2]] += left
    mouths = avatar.mouths * np.float32(scale)
    mouths[:, [0, 2]] += left
    eyes = None
    if avatar.eyes is not None:
        eyes = avatar.eyes * np.float32(scale)
        eyes[:, [0, 2]] += left
    return replace(
        avatar,
        name=name or scene_name(avatar.name, height),
        frames=out,
        face_boxes=boxes,
        mouths=mouths.astype(np.float32),
        eyes=None if eyes is None else eyes.astype(np.float32),
        meta={**avatar.meta, "scene_of": avatar.name, "description": f"{avatar.name} at {width}x{height}"},
    )
