"""A stage that fails mid-call ends that call cleanly, and the server goes on taking calls.

Policy: a failure of the session's media producer (here the backend's featurizer raising) ends the call. The
caller's tracks end, its peer connection is closed by the server, the session leaves ``/healthz`` and
``/sessions/{id}``, and none of the tasks the call started is left running. The error is logged once, with
the session id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.probe.media import PatternAudioTrack
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from tests.fakes import speech_pattern, to_int16

pytestmark = [pytest.mark.usefixtures("loopback_ice"), pytest.mark.slow]


class FailingFeaturizer:
    """The real featurizer until its backend is armed; then its next ``push`` raises."""

    def __init__(self, inner: object, backend: FailingBackend) -> None:
        self.inner = inner
        self.backend = backend

    @property
    def lookahead_samples(self) -> int:
        return int(self.inner.lookahead_samples)  # type: ignore[attr-defined]

    def push(self, hop: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if self.backend.armed:
            self.backend.raised += 1
            raise RuntimeError("injected featurizer failure")
        return self.inner.push(hop)  # type: ignore[attr-defined, no-any-return]

    def is_at_rest(self, conditioning: npt.NDArray[np.float32], speech: bool = False) -> bool:
        return bool(self.inner.is_at_rest(conditioning, speech))  # type: ignore[attr-defined]


class FailingBackend:
    """Wraps the server's backend; sessions made while ``armed`` is False work until it is set."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.armed = False
        self.raised = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def new_featurizer(self) -> FailingFeaturizer:
        return FailingFeaturizer(self.inner.new_featurizer(), self)  # type: ignore[attr-defined]

    def render(self, items: Sequence[RenderItem]) -> list[RenderedPatch]:
        return self.inner.render(items)  # type: ignore[attr-defined, no-any-return]


class Caller:
    """A real aiortc peer: speech out, the avatar's video counted as it arrives."""

    def __init__(self, audio: npt.NDArray[np.int16]) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTrack(PatternAudioTrack(audio))
        self.pc.addTransceiver("video", direction="recvonly")
        self.pc.createDataChannel("meta")
        self.frames = 0
        self.video_ended = asyncio.Event()
        self.connected = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self.connected.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video":
            self._tasks.append(asyncio.create_task(self._count(track)))

    async def _count(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                await track.recv()
                self.frames += 1
        except MediaStreamError:
            self.video_ended.set()

    async def offer(self, http: object) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        local = self.pc.localDescription
        response = await http.post("/offer", json={"sdp": local.sdp, "type": local.type})  # type: ignore[attr-defined]
        assert response.status == 200, await response.text()
        answer = await response.json()
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        await asyncio.wait_for(self.connected.wait(), 15)
        return str(answer["session_id"])

    async def frames_at_least(self, count: int, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.frames < count:
            assert loop.time() < deadline, f"only {self.frames} video frames in {timeout_s} s"
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def session_tasks(session_id: str) -> list[asyncio.Task[object]]:
    """Live tasks that belong to the session: named after it (producer, ingest, close, encoders)."""
    return [t for t in asyncio.all_tasks() if session_id in t.get_name() and not t.done()]


def server_media_tasks(baseline: set[asyncio.Task[object]]) -> list[str]:
    """Tasks started since ``baseline`` that run aiortc/aioice or lipcast code (not aiohttp's own)."""
    names = []
    for task in asyncio.all_tasks() - baseline:
        if task is asyncio.current_task() or task.done():
            continue
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None)
        module = code.co_filename if code is not None else ""
        if any(part in module for part in ("aiortc", "aioice", "streaming", "server")):
            names.append(f"{task.get_name()} ({getattr(coro, '__qualname__', '?')})")
    return names


async def test_a_failing_backend_ends_the_call_and_the_server_takes_the_next(
    aiohttp_client, caplog: pytest.LogCaptureFixture
) -> None:
    client = await aiohttp_client(create_app(Settings()))
    runtime = client.app[RUNTIME]
    backend = FailingBackend(runtime.sessions.backend)
    runtime.sessions.backend = backend  # type: ignore[assignment]
    audio = to_int16(speech_pattern([("silence", 0.3), ("speech", 20.0)]))
    baseline = set(asyncio.all_tasks())

    caller = Caller(audio)
    try:
        session_id = await caller.offer(client)
        await caller.frames_at_least(10, timeout_s=15)
        # What the checks below look for does exist while the call runs.
        assert any("avatar-stream" in t.get_name() for t in session_tasks(session_id))
        assert any("ingest" in t.get_name() for t in session_tasks(session_id))
        assert server_media_tasks(baseline)
        caplog.set_level(logging.INFO)
        backend.armed = True

        # The caller sees its call end: its video track ends (the server closed the connection).
        await asyncio.wait_for(caller.video_ended.wait(), 10)
        assert backend.raised == 1  # the producer stopped at its first failure

        # The session is gone from the books and from the API.
        health = await (await client.get("/healthz")).json()
        assert health["sessions"] == 0 and runtime.sessions.sessions == {}
        assert (await client.get(f"/sessions/{session_id}")).status == 404
    finally:
        await caller.close()

    # Nothing the call started is left running (aiortc's tasks included, once the client is closed too).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while loop.time() < deadline:
        if not session_tasks(session_id) and not server_media_tasks(baseline):
            break
        await asyncio.sleep(0.05)
    assert session_tasks(session_id) == []
    assert server_media_tasks(baseline) == []

    # The error was logged once, with the session id carried by the record (a LoggerAdapter's extra).
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert getattr(errors[0], "session_id", None) == session_id
    assert errors[0].exc_info is not None and "injected featurizer failure" in str(errors[0].exc_info[1])
    assert session_id in errors[0].getMessage()

    # The server goes on taking calls.
    backend.armed = False
    second = Caller(audio)
    try:
        second_id = await second.offer(client)
        assert second_id != session_id
        await second.frames_at_least(10, timeout_s=15)
        stats = await (await client.get(f"/sessions/{second_id}")).json()
        assert stats["stream"]["ticks"] >= 10
    finally:
        await second.close()
