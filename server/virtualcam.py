"""``--virtualcam``: the newest live session's avatar video on a virtual camera, for OBS or any video app.

pyvirtualcam (the optional ``lipcast[virtualcam]`` extra) writes frames to a v4l2loopback device on Linux
(``sudo modprobe v4l2loopback devices=1 exclusive_caps=1 card_label=lipcast``) or to OBS's Virtual Camera
on Windows and macOS. Video only: a camera has no sound (use the viewer page or WHEP for the voice).

The camera opens once, at the default avatar's size, when the server starts, so the device is there before
any call. Each 25 fps frame is the newest live session's current frame (the very pictures its caller gets:
its own :class:`AvatarVideoTrack` paces the session's frames, composed once per tick), letterboxed into the
camera's size; between sessions the default avatar at rest is shown at a low rate. A missing package or
device fails the start with a clear message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol, cast

import cv2
import numpy as np
import numpy.typing as npt
from aiohttp import web
from aiortc.mediastreams import MediaStreamError

from lipcast.server.sessions import SessionManager
from lipcast.server.state import RUNTIME, SETTINGS
from lipcast.streaming.avatar_stream import AvatarStream
from lipcast.streaming.clock import Clock
from lipcast.streaming.tasks import cancel_and_wait
from lipcast.streaming.tracks import AvatarVideoTrack

logger = logging.getLogger(__name__)

IDLE_FPS = 5  # between sessions: a still picture, refreshed so the device stays "live" for its readers
INSTALL_HINT = "pip install 'lipcast[virtualcam]'"
DEVICE_HINT = (
    "Linux: sudo modprobe v4l2loopback devices=1 exclusive_caps=1 card_label=lipcast "
    "(package v4l2loopback-dkms); Windows/macOS: install OBS Studio and start its Virtual Camera once"
)

Image = npt.NDArray[np.uint8]


class VirtualCameraError(RuntimeError):
    """No virtual camera can be opened: the package or the device is missing."""


class CameraSink(Protocol):
    """What lipcast needs of a camera (pyvirtualcam.Camera has this shape)."""

    def send(self, frame: Image) -> None: ...

    def close(self) -> None: ...


def open_camera(width: int, height: int, fps: int, device: str | None = None) -> CameraSink:
    """A pyvirtualcam camera taking RGB frames, or :class:`VirtualCameraError` saying what is missing."""
    try:
        import pyvirtualcam
    except ImportError as e:
        raise VirtualCameraError(f"--virtualcam needs the pyvirtualcam package: {INSTALL_HINT}") from e
    if device is not None and not Path(device).exists():
        raise VirtualCameraError(f"--virtualcam-device {device} does not exist. {DEVICE_HINT}")
    try:
        camera = pyvirtualcam.Camera(
            width=width, height=height, fps=fps, fmt=pyvirtualcam.PixelFormat.RGB, device=device
        )
    except RuntimeError as e:  # pyvirtualcam's "no v4l2 loopback device found" and friends
        raise VirtualCameraError(f"no virtual camera device could be opened ({e}). {DEVICE_HINT}") from e
    logger.info("virtual camera %s: %dx%d at %d fps", camera.device, width, height, fps)
    return cast(CameraSink, camera)


def fit(image: Image, width: int, height: int) -> Image:
    """``image`` scaled to fit ``width`` x ``height`` keeping its aspect, centred on black."""
    h, w = image.shape[:2]
    if (w, h) == (width, height):
        return image
    scale = min(width / w, height / h)
    new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
    resized = cv2.resize(
        image, (new_w, new_h), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    )
    out = np.zeros((height, width, 3), np.uint8)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top : top + new_h, left : left + new_w] = resized
    return out


class VirtualCamera:
    """Feeds ``camera`` from the stream ``newest_stream()`` names (None: no live session)."""

    def __init__(
        self,
        camera: CameraSink,
        newest_stream: Callable[[], AvatarStream | None],
        idle_image: Image,
        clock: Clock,
        *,
        width: int,
        height: int,
    ) -> None:
        self.camera = camera
        self.newest_stream = newest_stream
        self.width, self.height = width, height
        self.idle_image = fit(idle_image, width, height)
        self.clock = clock
        self.sent = 0
        self.following: str | None = None  # the session id shown now
        self._track: AvatarVideoTrack | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="virtualcam")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self._follow(None)
        self.camera.close()

    def _follow(self, stream: AvatarStream | None) -> None:
        if self._track is not None:
            self._track.stop()
            self._track = None
        self.following = None
        if stream is not None and stream.timeline is not None:
            self._track = AvatarVideoTrack(stream)
            newest = stream.timeline.index_at(stream.clock.now() - stream.render_budget_s)
            self._track.start_at(max(0, newest + 1))
            self.following = stream.session_id
            logger.info("[%s] on the virtual camera", stream.session_id)

    async def _send(self, image: Image) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.camera.send, image)
        self.sent += 1

    async def _run(self) -> None:
        idle_period_s = 1.0 / IDLE_FPS
        idle_due_s = self.clock.now()
        try:
            while True:
                stream = self.newest_stream()
                if stream is None or stream.closed or stream.timeline is None:
                    if self.following is not None:
                        self._follow(None)
                    # Idle frames on deadlines, so the send's own time does not add up (and no backlog of
                    # idle frames is sent after a session).
                    idle_due_s = max(idle_due_s, self.clock.now())
                    await self._send(self.idle_image)
                    idle_due_s += idle_period_s
                    await self.clock.sleep_until(idle_due_s)
                    continue
                if stream.session_id != self.following or self._track is None:
                    self._follow(stream)
                assert self._track is not None
                try:
                    frame = await self._track.next_frame()
                except MediaStreamError:  # that session ended
                    self._follow(None)
                    continue
                await self._send(fit(frame.image, self.width, self.height))  # shared: only read
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("the virtual camera feed failed; it stays on its last frame")


def check_available(device: str | None) -> None:
    """Fail early (before models load) when pyvirtualcam or the named device is missing."""
    try:
        import pyvirtualcam  # noqa: F401
    except ImportError as e:
        raise VirtualCameraError(f"--virtualcam needs the pyvirtualcam package: {INSTALL_HINT}") from e
    if device is not None and not Path(device).exists():
        raise VirtualCameraError(f"--virtualcam-device {device} does not exist. {DEVICE_HINT}")


def newest_live_stream(sessions: SessionManager) -> AvatarStream | None:
    """The stream of the most recently created session whose media clock runs."""
    for session in reversed(list(sessions.sessions.values())):
        if session.stream.started.is_set() and not session.stream.closed:
            return session.stream
    return None


def newest_session_feed(camera: CameraSink, sessions: SessionManager) -> VirtualCamera:
    """The feed of ``camera``: the newest live session, the default avatar's first frame between sessions."""
    avatar = sessions.avatar(None)
    return VirtualCamera(
        camera,
        lambda: newest_live_stream(sessions),
        avatar.frames[0],
        sessions.clock,
        width=avatar.width,
        height=avatar.height,
    )


async def virtualcam_ctx(app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup context (after the runtime's): open the camera, feed it, close it at shutdown."""
    settings, runtime = app[SETTINGS], app[RUNTIME]
    avatar = runtime.sessions.avatar(None)
    loop = asyncio.get_running_loop()
    camera = await loop.run_in_executor(
        None, open_camera, avatar.width, avatar.height, settings.fps, settings.virtualcam_device
    )
    feed = newest_session_feed(camera, runtime.sessions)
    feed.start()
    try:
        yield
    finally:
        await feed.stop()
