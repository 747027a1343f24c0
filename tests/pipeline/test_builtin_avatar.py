"""The built-in default avatar (pipeline/avatars/astronaut) loads, validates and animates."""

from __future__ import annotations

import numpy as np
import torch

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, DEFAULT_AVATAR, discover_avatars, load_avatar
from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.builtin import BuiltinBackend


def test_default_avatar_loads_and_validates() -> None:
    root = BUILTIN_AVATAR_DIR / DEFAULT_AVATAR
    avatar = load_avatar(root)
    assert avatar.name == DEFAULT_AVATAR == "astronaut"
    assert avatar.frame_count == 1
    assert max(avatar.width, avatar.height) <= 384
    assert "public domain" in avatar.meta["license"]
    assert (root / "frames" / "000000.png").stat().st_size < 250_000
    assert discover_avatars([BUILTIN_AVATAR_DIR])[DEFAULT_AVATAR] == root


def test_default_avatar_mouth_lies_inside_its_face_box() -> None:
    avatar = load_avatar(BUILTIN_AVATAR_DIR / DEFAULT_AVATAR)
    x1, y1, x2, y2 = avatar.face_boxes[0]
    mouth = avatar.mouth(0)
    assert x1 < mouth.left_x < mouth.right_x < x2
    assert y1 < min(mouth.left_y, mouth.right_y) < mouth.lip_y < mouth.chin_y < y2
    assert 0.3 < mouth.width / (x2 - x1) < 0.6


def test_default_avatar_animates() -> None:
    avatar = load_avatar(BUILTIN_AVATAR_DIR / DEFAULT_AVATAR)
    backend = BuiltinBackend(torch.device("cpu"))
    backend.add_avatar(avatar)
    rest, speaking = backend.render(
        [
            RenderItem(avatar.name, 0, np.zeros(3, np.float32)),
            RenderItem(avatar.name, 0, np.array([1.0, 0.0, 0.0], np.float32)),
        ]
    )
    height, width = rest.pixels.shape[:2]
    original = avatar.frames[0, rest.top : rest.top + height, rest.left : rest.left + width]
    np.testing.assert_array_equal(rest.pixels, original)
    changed = np.abs(speaking.pixels.astype(int) - original.astype(int)).max(axis=2) > 30
    assert changed.sum() > 200
