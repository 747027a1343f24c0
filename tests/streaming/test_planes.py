"""The paste (streaming/planes.py): exact at the avatar's size, nothing outside the face changes when
scaled, and the idle frames' planes cache: lazy, shared, bounded, and holding its avatars weakly."""

from __future__ import annotations

import gc

import numpy as np

from lipcast.pipeline.backend import RenderedPatch
from lipcast.pipeline.compositing import paste_patch
from lipcast.streaming.planes import IdlePlanes, frame_planes, paste_into_planes, plane_views, to_yuv420p
from lipcast.streaming.sizes import OutputSize, placement
from tests.fakes import tiny_avatar


def random_patch(rng: np.random.Generator, top: int, left: int, h: int, w: int) -> RenderedPatch:
    return RenderedPatch(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), top, left)


def test_at_the_avatars_size_the_planes_are_those_of_the_whole_picture_converted() -> None:
    rng = np.random.default_rng(3)
    for height, width, top, left, h, w in (
        (32, 32, 4, 4, 8, 8),
        (64, 48, 5, 7, 9, 11),
        (40, 40, 0, 1, 40, 9),
    ):
        source = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
        patch = random_patch(rng, top, left, h, w)
        place = placement(width, height, OutputSize(width, height))
        for mix in (1.0, 0.4):
            expected = to_yuv420p(paste_patch(source, patch, mix))
            got = paste_into_planes(to_yuv420p(source), place, patch, mix, source)
            np.testing.assert_array_equal(got, expected)


def test_scaled_into_a_larger_picture_only_the_patchs_box_changes() -> None:
    rng = np.random.default_rng(4)
    source = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    size = OutputSize(128, 72)  # the square avatar letterboxed: 72x72 at left 28
    place = placement(32, 32, size)
    assert (place.top, place.left, place.width, place.height) == (0, 28, 72, 72)
    base = frame_planes(source, place)
    y, u, v = plane_views(base, size)
    assert (y[:, :28] == 16).all() and (u[:, :14] == 128).all() and (v[:, -14:] == 128).all()  # black bars
    patch = random_patch(rng, 8, 8, 8, 12)
    out = paste_into_planes(base, place, patch)
    oy, _, _ = plane_views(out, size)
    changed = np.argwhere(oy != y)
    scale = place.scale
    assert changed[:, 0].min() >= 8 * scale and changed[:, 0].max() < 16 * scale
    assert changed[:, 1].min() >= 28 + 8 * scale and changed[:, 1].max() < 28 + 20 * scale
    np.testing.assert_array_equal(paste_into_planes(base, place, patch, mix=0.0), base)


def test_idle_planes_are_lazy_shared_bounded_and_hold_their_avatars_weakly() -> None:
    avatar = tiny_avatar(frames=4)
    size = OutputSize(64, 36)
    frame_bytes = 64 * 36 * 3 // 2
    cache = IdlePlanes(budget_bytes=3 * frame_bytes)
    assert cache.stats.converted == 0 and cache.avatars() == 0  # nothing before it is asked for
    first = cache.planes(avatar, 0, size)
    assert cache.planes(avatar, 0, size) is first and not first.flags.writeable  # shared, read-only
    for index in range(4):
        cache.planes(avatar, index, size)
    assert cache.stats.converted == 4 and cache.stats.over_budget == 1
    assert cache.stats.kept_bytes == 3 * frame_bytes <= cache.budget_bytes
    assert cache.planes(avatar, 3, size) is not cache.planes(avatar, 3, size)  # beyond the budget: made anew
    del avatar, first
    gc.collect()
    assert cache.avatars() == 0 and cache.stats.kept_bytes == 0


def test_prefetch_converts_a_sizes_frames_ahead_within_the_budget() -> None:
    avatar = tiny_avatar(frames=5)
    size = OutputSize(64, 64)
    cache = IdlePlanes(budget_bytes=3 * 64 * 64 * 3 // 2)
    assert cache.prefetch(avatar, size).result(timeout=10) == 3  # the budget holds three
    converted = cache.stats.converted
    cache.planes(avatar, 1, size)
    assert cache.stats.converted == converted  # already there
