"""--virtualcam without a device: frame feeding against a fake camera, and every way it can be missing.

The real path (pyvirtualcam -> v4l2loopback) cannot run here: no such kernel module in CI.
"""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Callable

import numpy as np
import pytest

from lipcast import cli
from lipcast.server.virtualcam import (
    IDLE_FPS,
    VirtualCamera,
    VirtualCameraError,
    check_available,
    fit,
    open_camera,
)
from lipcast.streaming.audio_buffer import InputAudioBuffer
from lipcast.streaming.avatar_stream import AvatarStream
from tests.fakes import FakeClock, LevelFeaturizer, tiny_avatar


class FakeCamera:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []
        self.closed = False

    def send(self, frame: np.ndarray) -> None:
        self.frames.append(frame.copy())

    def close(self) -> None:
        self.closed = True


class NoRenderer:
    def submit(self, session_id, item, deadline_s=None):  # type: ignore[no-untyped-def]
        raise AssertionError("silence needs no rendering")

    def cancel_session(self, session_id: str) -> int:
        return 0


async def until(condition: Callable[[], bool], what: str) -> None:
    """Camera frames arrive from an executor thread: wait (boundedly) for the thread, not for media time."""
    for _ in range(2000):  # up to 10 s: a busy machine may be slow to schedule the thread
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def test_fit_letterboxes_into_the_camera_size() -> None:
    image = np.full((32, 32, 3), 200, np.uint8)
    out = fit(image, 64, 48)
    assert out.shape == (48, 64, 3)
    assert (out[:, :8] == 0).all() and (out[:, -8:] == 0).all()
    assert (out[:, 8:56] == 200).all()
    assert fit(image, 32, 32) is image


async def test_feeds_the_newest_stream_and_idles_between_sessions() -> None:
    clock = FakeClock()
    avatar = tiny_avatar(size=32)
    stream = AvatarStream(
        "s1", avatar, LevelFeaturizer(), NoRenderer(), InputAudioBuffer(48_000, target_ms=40), clock
    )
    current: list[AvatarStream | None] = [None]
    camera = FakeCamera()
    idle = np.full((32, 32, 3), 7, np.uint8)
    feed = VirtualCamera(camera, lambda: current[0], idle, clock, width=64, height=48)
    feed.start()
    try:
        await until(lambda: len(camera.frames) == 1, "the idle picture")
        assert (camera.frames[0][:, 8:56] == 7).all() and (camera.frames[0][:, :8] == 0).all()
        await clock.advance(1.0 / IDLE_FPS)
        await until(lambda: len(camera.frames) == 2, "the idle picture again")

        stream.start()
        current[0] = stream
        await clock.advance(1.0 / IDLE_FPS)
        await until(lambda: feed.following == "s1", "following the session")
        count = len(camera.frames)
        for tick in range(5):
            await clock.advance(0.04)
            # Let the executor's send land before the next tick (the first tick may not yet carry a frame).
            await until(lambda tick=tick: len(camera.frames) >= count + tick, "the session's next frame")
        await until(lambda: len(camera.frames) >= count + 4, "the session's frames")
        frame = camera.frames[-1]
        assert frame.shape == (48, 64, 3)
        # The avatar at rest (silence), letterboxed like the idle picture.
        assert np.array_equal(frame[:, 8:56], fit(avatar.frames[0], 48, 48))

        await stream.stop()
        await clock.advance(0.1)
        await until(lambda: feed.following is None, "dropping the ended session")
        await clock.advance(1.0 / IDLE_FPS)
        await until(lambda: (camera.frames[-1][:, 8:56] == 7).all(), "the idle picture after the session")
    finally:
        await feed.stop()
    assert camera.closed


def without_pyvirtualcam(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyvirtualcam", None)  # import raises ImportError


def fake_pyvirtualcam(monkeypatch: pytest.MonkeyPatch, error: str | None) -> list[dict]:
    opened: list[dict] = []

    class Camera:
        device = "/dev/video-fake"

        def __init__(self, **kwargs: object) -> None:
            if error is not None:
                raise RuntimeError(error)
            opened.append(kwargs)

    module = types.SimpleNamespace(Camera=Camera, PixelFormat=types.SimpleNamespace(RGB="RGB"))
    monkeypatch.setitem(sys.modules, "pyvirtualcam", module)
    return opened


def test_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    without_pyvirtualcam(monkeypatch)
    with pytest.raises(VirtualCameraError, match=r"pip install 'lipcast\[virtualcam\]'"):
        open_camera(320, 320, 25)
    with pytest.raises(VirtualCameraError, match="pyvirtualcam"):
        check_available(None)


def test_no_loopback_device_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pyvirtualcam(monkeypatch, "No v4l2 loopback device found at /dev/video[0-99]")
    with pytest.raises(VirtualCameraError, match="modprobe v4l2loopback"):
        open_camera(320, 320, 25)
    with pytest.raises(VirtualCameraError, match="/dev/video99 does not exist"):
        open_camera(320, 320, 25, "/dev/video99")
    with pytest.raises(VirtualCameraError, match="/dev/video99 does not exist"):
        check_available("/dev/video99")


def test_opens_an_rgb_camera_of_the_given_size(monkeypatch: pytest.MonkeyPatch) -> None:
    opened = fake_pyvirtualcam(monkeypatch, None)
    open_camera(320, 240, 25)
    assert opened == [{"width": 320, "height": 240, "fps": 25, "fmt": "RGB", "device": None}]


def test_serve_exits_2_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    without_pyvirtualcam(monkeypatch)
    assert cli.main(["serve", "--virtualcam", "--port", "1"]) == 2
    assert "pip install 'lipcast[virtualcam]'" in capsys.readouterr().err
