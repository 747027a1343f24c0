"""The idle loop of a still avatar: breathing below the face, one blink, the mouth region untouched."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
import torch

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, DEFAULT_AVATAR, AvatarError, load_avatar
from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.builtin import BuiltinBackend
from lipcast.pipeline.engine import RenderEngine
from lipcast.pipeline.idle import BLINK_CLOSURE, IDLE_LOOP_FRAMES, blink_closure, with_idle_motion
from lipcast.pipeline.registry import AvatarRegistry
from lipcast.streaming.avatar_stream import idle_frame_index
from tests.fakes import FakeBackend, tiny_avatar


@pytest.fixture(scope="module")
def photo_avatar():
    return load_avatar(BUILTIN_AVATAR_DIR / DEFAULT_AVATAR)


def test_a_still_becomes_a_breathing_blinking_loop(photo_avatar) -> None:
    idle = with_idle_motion(photo_avatar)
    assert idle.frame_count == IDLE_LOOP_FRAMES and idle.meta["idle"] == "breathing"
    np.testing.assert_array_equal(idle.frames[0], photo_avatar.frames[0])
    frames = idle.frames.astype(np.int16)
    # The face's lower half (the lip-sync backends' region) is the photo's in every frame.
    np.testing.assert_array_equal(frames[:, 118:185], frames[:1, 118:185].repeat(len(frames), 0))
    # The shoulders rise and fall, slowly: a sub-pixel step per frame.
    bottom = np.abs(frames[:, 260:] - frames[0, 260:]).mean(axis=(1, 2, 3))
    assert bottom[-1] > 3.0 and bottom[-1] == bottom.max()
    assert np.abs(np.diff(frames[:, 260:], axis=0)).mean(axis=(1, 2, 3)).max() < 1.0
    # The eyes close once, in the middle of the loop, and only there.
    eyes = np.abs(frames[:, 92:110, 125:200] - frames[0, 92:110, 125:200]).mean(axis=(1, 2, 3))
    closed = np.nonzero(blink_closure(IDLE_LOOP_FRAMES))[0]
    assert len(closed) == len(BLINK_CLOSURE)
    assert eyes[closed].max() > 8.0 and np.delete(eyes, closed).max() < 0.5
    np.testing.assert_array_equal(idle.mouths, photo_avatar.mouths.repeat(IDLE_LOOP_FRAMES, 0))


def test_the_ping_pong_period_is_a_whole_breath_with_one_blink_each_way() -> None:
    indices = [idle_frame_index(k, IDLE_LOOP_FRAMES) for k in range(2 * (IDLE_LOOP_FRAMES - 1) + 1)]
    assert indices[0] == indices[-1] == 0 and max(indices) == IDLE_LOOP_FRAMES - 1
    closure = blink_closure(IDLE_LOOP_FRAMES)
    blinks = sum(1 for a, b in zip(indices, indices[1:], strict=False) if closure[a] == 0 < closure[b])
    assert blinks == 2  # every 2.9 s


def test_video_avatars_and_opted_out_stills_are_kept(photo_avatar) -> None:
    video = tiny_avatar(frames=5)
    assert with_idle_motion(video).frame_count == 5
    still = replace(photo_avatar, meta={**photo_avatar.meta, "idle_motion": False})
    assert with_idle_motion(still).frame_count == 1
    no_eyes = replace(photo_avatar, eyes=None)
    breathing = with_idle_motion(no_eyes)
    assert breathing.frame_count == IDLE_LOOP_FRAMES and breathing.eyes is None


def test_eye_rows_are_validated(photo_avatar) -> None:
    with pytest.raises(AvatarError, match="eyes has shape"):
        replace(photo_avatar, eyes=np.zeros((2, 4), np.float32))
    with pytest.raises(AvatarError, match="left eye not left"):
        replace(photo_avatar, eyes=np.array([[180, 100, 140, 100]], np.float32))


def test_registry_adds_avatars_while_the_engine_renders(photo_avatar) -> None:
    backend = FakeBackend()
    engine = RenderEngine(backend, (1, 2))
    registry = AvatarRegistry(engine)
    registry.add(tiny_avatar("first"))
    engine.start()
    try:
        calls: list[str] = []
        original = backend.add_avatar

        def add_avatar(avatar):
            calls.append(threading.current_thread().name)
            original(avatar)

        backend.add_avatar = add_avatar  # type: ignore[method-assign]
        served = registry.add(tiny_avatar("second", frames=3))
        assert calls == ["render-engine"]  # the worker did it, between batches
        assert sorted(registry) == ["first", "second"] and registry["second"] is served
        patch = engine.submit("s", RenderItem("second", 2, np.ones(1, np.float32))).result(timeout=5)
        assert patch.pixels.shape == (8, 8, 3)
    finally:
        engine.stop()


def test_the_builtin_backend_animates_the_idle_loop(photo_avatar) -> None:
    idle = with_idle_motion(photo_avatar)
    backend = BuiltinBackend(torch.device("cpu"))
    backend.add_avatar(idle)
    rest, speaking = backend.render(
        [
            RenderItem(idle.name, 36, np.zeros(3, np.float32)),
            RenderItem(idle.name, 36, np.ones(3, np.float32)),
        ]
    )
    h, w = rest.pixels.shape[:2]
    np.testing.assert_array_equal(
        rest.pixels, idle.frames[36, rest.top : rest.top + h, rest.left : rest.left + w]
    )
    assert np.abs(speaking.pixels.astype(int) - rest.pixels).max() > 30
