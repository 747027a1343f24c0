from __future__ import annotations

import numpy as np
import pytest
import torch

from lipcast.pipeline.avatar import Avatar, UnknownAvatarError
from lipcast.pipeline.backend import Featurizer, LipSyncBackend, RenderedPatch, RenderItem
from lipcast.pipeline.builtin import BuiltinBackend, mouth_rois

CPU = torch.device("cpu")


def face_avatar(name: str, height: int, width: int, mouths: list[list[float]], seed: int = 0) -> Avatar:
    """An avatar whose frames are smooth random texture with a bright band above each lip line."""
    rng = np.random.default_rng(seed)
    count = len(mouths)
    coarse = rng.uniform(120, 220, size=(count, height // 8 + 1, width // 8 + 1, 3))
    frames = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)[:, :height, :width]
    frames = frames + rng.uniform(-20, 20, size=frames.shape)
    for frame, (lx, ly, rx, _, lip_y, _) in zip(frames, mouths, strict=True):
        frame[int(ly) : int(lip_y), int(lx) : int(rx)] = 245.0
    boxes = np.array([[0, 0, width, height]] * count, dtype=np.int32)
    return Avatar(name, 25, frames.round().astype(np.uint8), boxes, np.array(mouths, dtype=np.float32))


@pytest.fixture
def avatars() -> tuple[Avatar, Avatar]:
    walker = face_avatar(
        "walker",
        200,
        160,
        [[60, 110, 100, 111, 118, 145], [62, 112, 102, 112, 119, 147], [58, 108, 99, 110, 117, 144]],
    )
    small = face_avatar("small", 120, 120, [[45, 70, 75, 70, 76, 95]], seed=3)
    return walker, small


@pytest.fixture
def backend(avatars: tuple[Avatar, Avatar]) -> BuiltinBackend:
    backend = BuiltinBackend(CPU)
    for avatar in avatars:
        backend.add_avatar(avatar)
    return backend


def item(avatar: str, frame: int, *values: float) -> RenderItem:
    return RenderItem(avatar, frame, np.array(values, dtype=np.float32))


def roi_of(avatar: Avatar, frame: int, patch: RenderedPatch) -> np.ndarray:
    height, width = patch.pixels.shape[:2]
    return avatar.frames[frame, patch.top : patch.top + height, patch.left : patch.left + width]


def test_implements_the_backend_seam(backend: BuiltinBackend) -> None:
    assert isinstance(backend, LipSyncBackend)
    assert backend.name == "builtin"
    assert backend.conditioning_shape == (3,)
    assert backend.lookahead_ms == 20.0
    featurizer = backend.new_featurizer()
    assert isinstance(featurizer, Featurizer)
    assert featurizer.lookahead_samples == 320
    assert BuiltinBackend(CPU, lookahead_ms=10.0).new_featurizer().lookahead_samples == 160


def test_rois_have_one_size_per_avatar_and_cover_mouth_and_chin(
    avatars: tuple[Avatar, Avatar],
) -> None:
    walker, _ = avatars
    rois = mouth_rois(walker)
    assert rois.height % 8 == 0 and rois.width % 8 == 0
    for i, (lx, ly, rx, ry, _, chin_y) in enumerate(walker.mouths):
        top, left = rois.tops[i], rois.lefts[i]
        assert left < lx - 20 and rx + 20 < left + rois.width
        assert top < min(ly, ry) - 10 and chin_y + 20 < top + rois.height


def test_rois_shift_to_stay_inside_the_frame() -> None:
    near_edge = face_avatar("edge", 100, 100, [[2, 80, 40, 80, 86, 97]])
    rois = mouth_rois(near_edge)
    assert rois.lefts[0] == 0 and rois.tops[0] == 100 - rois.height
    assert rois.width <= 100 and rois.height <= 100


def test_zero_params_give_the_original_roi_exactly(
    backend: BuiltinBackend, avatars: tuple[Avatar, Avatar]
) -> None:
    walker, small = avatars
    items = [item("walker", i, 0, 0, 0) for i in range(3)] + [item("small", 0, 0, 0, 0)]
    patches = backend.render(items)
    for patch, it in zip(patches, items, strict=True):
        avatar = walker if it.avatar == "walker" else small
        assert patch.pixels.dtype == np.uint8
        np.testing.assert_array_equal(patch.pixels, roi_of(avatar, it.frame_index, patch))


def test_patches_have_a_fixed_size_and_follow_the_mouth(
    backend: BuiltinBackend, avatars: tuple[Avatar, Avatar]
) -> None:
    walker, _ = avatars
    patches = backend.render([item("walker", i, 1, 0, 0) for i in range(3)])
    rois = mouth_rois(walker)
    for i, patch in enumerate(patches):
        assert patch.pixels.shape == (rois.height, rois.width, 3)
        assert (patch.top, patch.left) == (rois.tops[i], rois.lefts[i])
    assert len({(p.top, p.left) for p in patches}) == 3


def test_opening_darkens_the_mouth_and_leaves_the_border_alone(
    backend: BuiltinBackend, avatars: tuple[Avatar, Avatar]
) -> None:
    walker, _ = avatars
    closed, opened = backend.render([item("walker", 0, 0, 0, 0), item("walker", 0, 1, 1, 0)])
    lx, _, rx, _, lip_y, _ = walker.mouths[0]
    rows = slice(int(lip_y) + 1 - opened.top, int(lip_y) + 5 - opened.top)
    cols = slice(int(lx + rx) // 2 - 6 - opened.left, int(lx + rx) // 2 + 6 - opened.left)
    assert opened.pixels[rows, cols].mean() < closed.pixels[rows, cols].mean() - 50
    border = np.ones(opened.pixels.shape[:2], dtype=bool)
    border[3:-3, 3:-3] = False
    np.testing.assert_array_equal(opened.pixels[border], closed.pixels[border])


def test_a_mixed_batch_equals_renders_one_by_one(backend: BuiltinBackend) -> None:
    items = [
        item("walker", 2, 0.8, 0.1, 0.0),
        item("small", 0, 1.0, 0.0, 1.0),
        item("walker", 0, 0.0, 0.0, 0.0),
        item("small", 5, 0.3, 0.9, 0.0),  # frame indices wrap around the avatar's frames
        item("walker", 4, 0.5, 0.5, 0.5),
    ]
    batch = backend.render(items)
    assert len(batch) == len(items)
    for it, patch in zip(items, batch, strict=True):
        (alone,) = backend.render([it])
        assert (alone.top, alone.left) == (patch.top, patch.left)
        np.testing.assert_array_equal(alone.pixels, patch.pixels)


def test_out_of_range_conditioning_is_clipped(backend: BuiltinBackend) -> None:
    clipped, reference = backend.render([item("small", 0, 3.0, -1, 2.0), item("small", 0, 1, 0, 1)])
    np.testing.assert_array_equal(clipped.pixels, reference.pixels)


def test_errors(backend: BuiltinBackend) -> None:
    with pytest.raises(UnknownAvatarError):
        backend.render([item("nobody", 0, 0, 0, 0)])
    with pytest.raises(ValueError, match="shape"):
        backend.render([item("small", 0, 0.5, 0.5)])
    backend.remove_avatar("small")
    backend.remove_avatar("small")  # a second removal is harmless
    with pytest.raises(UnknownAvatarError):
        backend.render([item("small", 0, 0, 0, 0)])


@pytest.mark.gpu
def test_cuda_matches_the_cpu(avatars: tuple[Avatar, Avatar]) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cpu, cuda = BuiltinBackend(CPU), BuiltinBackend(torch.device("cuda"))
    for backend in (cpu, cuda):
        for avatar in avatars:
            backend.add_avatar(avatar)
    items = [item("walker", 1, 0.7, 0.2, 0.1), item("small", 0, 1, 0, 1), item("small", 0, 0, 0, 0)]
    for on_cpu, on_cuda in zip(cpu.render(items), cuda.render(items), strict=True):
        assert (on_cpu.top, on_cpu.left) == (on_cuda.top, on_cuda.left)
        difference = np.abs(on_cpu.pixels.astype(int) - on_cuda.pixels.astype(int))
        assert difference.max() <= 2 and difference.mean() < 0.05
    np.testing.assert_array_equal(cuda.render(items)[2].pixels, cpu.render(items)[2].pixels)
