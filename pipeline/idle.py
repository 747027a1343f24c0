"""Idle motion for still avatars: a precomputed loop of breathing and a blink, made once per avatar.

A video avatar idles by playing its own frames forth and back
(``lipcast.streaming.avatar_stream.idle_frame_index``). A one-frame avatar (a photo) would stand frozen, so
:func:`with_idle_motion` turns it into :data:`IDLE_LOOP_FRAMES` frames that the same ping-pong plays: frame 0
is the photo itself; over the loop the shoulders rise (an inhalation; the way back is the exhalation), and in
its middle the eyes blink once (so the ping-pong blinks every :data:`IDLE_LOOP_FRAMES` - 1 frames, 2.9 s at 25
fps). Breathing follows a half cosine, so the ping-pong turns without a jerk. The face itself does not move:
the mouth region stays exactly as in the photo, so the lip-sync backends' crops and the geometry are the
photo's in every frame, and a still mouth at rest is still in the video too.

All of it is computed at load time (a few ms per frame), never per tick: sessions only index the frames.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import cv2
import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import Avatar

logger = logging.getLogger(__name__)

UInt8Array = npt.NDArray[np.uint8]
FloatArray = npt.NDArray[np.float32]

IDLE_LOOP_FRAMES = 73  # one way; the ping-pong period is 2 * 72 frames = 5.76 s (about 10 breaths a minute)
BREATH_RISE_PX = 1.5  # at full inhalation the bottom edge (the shoulders) rises this much ...
BREATH_START_BELOW_CHIN = 0.15  # ... fading to nothing this many face heights below the face box
# Blink: eyelid closure (0 open, 1 shut) on consecutive frames, centred in the loop: ~240 ms at 25 fps.
BLINK_CLOSURE = (0.3, 0.75, 1.0, 0.9, 0.55, 0.2)
# Eye shape in inter-eye distances (centre to centre).
EYE_HALF_OPENING = 0.09  # upper lid above the eye's centre
EYE_LID_TOP = 0.26  # the skin above the eye that the lid stretches from (just below the brow)
EYE_LID_CLOSED = 0.06  # the closed lid's edge, below the eye's centre
EYE_HALF_WIDTH = (0.17, 0.30)  # the lid closes fully within the first |dx|, not at all beyond the second
EYE_PATCH_BELOW = 0.25
LASH_DARKENING = 0.3  # the closed lid's edge is darkened by this much at most (the lashes)


def with_idle_motion(avatar: Avatar, frames: int = IDLE_LOOP_FRAMES) -> Avatar:
    """A one-frame avatar as an idle loop of ``frames`` frames; other avatars as they are.

    ``meta["idle_motion"] = false`` in the manifest keeps a still avatar still. The result's meta gets
    ``idle`` (``"breathing"``, ``"loop"`` or ``"still"``) and ``source_frames``.
    """
    if avatar.frame_count > 1:
        return replace(avatar, meta={**avatar.meta, "idle": "loop", "source_frames": avatar.frame_count})
    if not avatar.meta.get("idle_motion", True) or frames < 2:
        return replace(avatar, meta={**avatar.meta, "idle": "still", "source_frames": 1})
    photo = avatar.frames[0]
    height, width = photo.shape[:2]
    x1, y1, x2, y2 = (int(v) for v in avatar.face_boxes[0])
    start_y = y2 + BREATH_START_BELOW_CHIN * (y2 - y1)
    closure = blink_closure(frames) if avatar.eyes is not None else np.zeros(frames, np.float32)
    out = np.empty((frames, height, width, 3), np.uint8)
    for k in range(frames):
        breath = (1.0 - math.cos(math.pi * k / (frames - 1))) / 2.0
        out[k] = photo if k == 0 else breathe(photo, start_y, BREATH_RISE_PX * breath)
        if closure[k] > 0 and avatar.eyes is not None:
            out[k] = close_eyes(out[k], avatar.eyes[0], float(closure[k]))
    logger.info(
        "avatar %r: %d idle frames (breathing%s)", avatar.name, frames, ", a blink" * bool(closure.any())
    )
    return replace(
        avatar,
        frames=out,
        face_boxes=np.repeat(avatar.face_boxes, frames, axis=0),
        mouths=np.repeat(avatar.mouths, frames, axis=0),
        eyes=None if avatar.eyes is None else np.repeat(avatar.eyes, frames, axis=0),
        meta={**avatar.meta, "idle": "breathing", "source_frames": 1},
    )


def breathe(image: UInt8Array, start_y: float, rise_px: float) -> UInt8Array:
    """``image`` with everything below ``start_y`` lifted, smoothly, by up to ``rise_px`` at the bottom."""
    height, width = image.shape[:2]
    first = max(0, int(start_y))
    if first >= height - 2 or rise_px <= 0.0:
        return image.copy()
    ys = np.arange(first, height, dtype=np.float32)
    t = np.clip((ys - start_y) / max(1.0, height - 1 - start_y), 0.0, 1.0)
    source_y = (ys + rise_px * t * t * (3.0 - 2.0 * t))[:, None]
    map_y = np.broadcast_to(source_y, (height - first, width)).astype(np.float32)
    map_x = np.broadcast_to(np.arange(width, dtype=np.float32)[None, :], map_y.shape).astype(np.float32)
    out = image.copy()
    # Bicubic: sub-pixel shifts with bilinear sampling would visibly soften the shoulders as they rise.
    out[first:] = cv2.remap(image, map_x, map_y, cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE)
    return out


def blink_closure(frames: int) -> FloatArray:
    """Eyelid closure per loop frame: one blink centred in the loop (none in loops too short for one)."""
    closure = np.zeros(frames, np.float32)
    if frames < len(BLINK_CLOSURE) + 4:
        return closure
    start = (frames - len(BLINK_CLOSURE)) // 2
    closure[start : start + len(BLINK_CLOSURE)] = BLINK_CLOSURE
    return closure


def close_eyes(frame: UInt8Array, eyes: FloatArray, closure: float) -> UInt8Array:
    """``frame`` with both upper eyelids lowered by ``closure`` (0 open, 1 shut).

    The skin between the brow and the upper lid is stretched down over the eye (a backward vertical warp
    that is strongest at the eye's centre and fades out toward its corners), and the lid's edge darkened.
    """
    out = frame.copy()
    left_x, left_y, right_x, right_y = (float(v) for v in eyes)
    distance = math.hypot(right_x - left_x, right_y - left_y)
    if distance < 4.0 or closure <= 0.0:
        return out
    for eye_x, eye_y in ((left_x, left_y), (right_x, right_y)):
        _close_eye(out, eye_x, eye_y, distance, closure)
    return out


def _close_eye(image: UInt8Array, eye_x: float, eye_y: float, distance: float, closure: float) -> None:
    height, width = image.shape[:2]
    x1 = max(0, int(eye_x - EYE_HALF_WIDTH[1] * distance))
    x2 = min(width, int(math.ceil(eye_x + EYE_HALF_WIDTH[1] * distance)) + 1)
    y1 = max(0, int(eye_y - EYE_LID_TOP * distance))
    y2 = min(height, int(math.ceil(eye_y + EYE_PATCH_BELOW * distance)) + 1)
    if x2 - x1 < 3 or y2 - y1 < 3:
        return
    xs = np.arange(x1, x2, dtype=np.float32)[None, :]
    ys = np.arange(y1, y2, dtype=np.float32)[:, None]
    dx = np.abs(xs - eye_x) / distance
    inner, outer = EYE_HALF_WIDTH
    t = np.clip((outer - dx) / (outer - inner), 0.0, 1.0)
    weight = t * t * (3.0 - 2.0 * t)  # (1, w): 1 at the eye's middle, 0 past its corners
    top = eye_y - EYE_LID_TOP * distance
    lid_open = eye_y - EYE_HALF_OPENING * distance
    lid_closed = eye_y + EYE_LID_CLOSED * distance
    lid = lid_open + closure * weight * (lid_closed - lid_open)  # (1, w): the lid's edge now
    stretch = (lid_open - top) / np.maximum(lid - top, 1e-3)
    above = ys <= lid
    source_y = np.where(above, top + (ys - top) * stretch, ys).astype(np.float32)
    source_x = np.broadcast_to(xs, source_y.shape).astype(np.float32)
    patch = image[y1:y2, x1:x2]
    warped = cv2.remap(
        image, source_x, source_y, interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    ).astype(np.float32)
    lash = 1.0 - LASH_DARKENING * closure * weight * np.exp(-(((ys - lid) / 1.2) ** 2))
    patch[:] = np.clip(warped * lash[:, :, None] + 0.5, 0, 255).astype(np.uint8)
