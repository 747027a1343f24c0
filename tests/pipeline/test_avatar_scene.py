"""The built-in avatar's HD scenes, and the built-in backend rendering their mouths at its own size."""

from __future__ import annotations

import numpy as np
import torch

from lipcast.pipeline.assembly import load_avatars
from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, DEFAULT_AVATAR
from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.builtin import MAX_RENDER_WIDTH_PX, BuiltinBackend, mouth_rois
from lipcast.pipeline.compositing import paste_patch


def test_the_720p_scene_is_the_portrait_scaled_with_its_geometry() -> None:
    avatars = load_avatars((BUILTIN_AVATAR_DIR,), DEFAULT_AVATAR, ((1280, 720),))
    small, scene = avatars[DEFAULT_AVATAR], avatars["astronaut-720p"]
    assert (scene.width, scene.height, scene.frame_count) == (1280, 720, 1)
    scale, left = 720 / 320, (1280 - 720) // 2
    np.testing.assert_allclose(scene.mouths[0, [0, 2]], small.mouths[0, [0, 2]] * scale + left, atol=0.01)
    np.testing.assert_allclose(
        scene.mouths[0, [1, 3, 4, 5]], small.mouths[0, [1, 3, 4, 5]] * scale, atol=0.01
    )
    # The mouth region is the portrait's, scaled (the backdrop is only around it).
    x1, y1, x2, y2 = (int(v) for v in scene.face_boxes[0])
    face = scene.frames[0, y1:y2, x1:x2].astype(np.float32)
    assert face.std() > 20 and abs(face.mean() - small.frames[0, 75:180, 111:208].mean()) < 8


def test_an_hd_mouth_is_rendered_at_the_backends_own_size_and_pasted_at_the_avatars() -> None:
    scene = load_avatars((BUILTIN_AVATAR_DIR,), DEFAULT_AVATAR, ((1280, 720),))["astronaut-720p"]
    backend = BuiltinBackend(torch.device("cpu"))
    backend.add_avatar(scene)
    rois = mouth_rois(scene)
    patch = backend.render([RenderItem(scene.name, 0, np.array([0.9, 0.3, 0.1], np.float32))])[0]
    assert patch.pixels.shape[1] == MAX_RENDER_WIDTH_PX < rois.width
    assert (patch.height, patch.width) == (rois.height, rois.width)
    frame = paste_patch(scene.frames[0], patch)
    changed = np.argwhere((frame != scene.frames[0]).any(axis=2))
    assert changed[:, 0].min() >= patch.top and changed[:, 0].max() < patch.top + rois.height
    assert changed[:, 1].min() >= patch.left and changed[:, 1].max() < patch.left + rois.width
    assert len(changed) > 500  # the mouth opened
