"""``--media-workers 2``: a front in this process, two real media worker processes, real peers on loopback.

Calls are spread over both workers; everything addressed to a session (its stats, WHEP viewers, DELETE)
reaches the worker that owns it; a worker killed with SIGKILL mid-call loses only its own call (freed,
counted, replaced) while the call on the other worker goes on without a freeze.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest
from aiohttp.test_utils import TestClient

from lipcast.pipeline.engine_group import EngineGroup
from lipcast.probe.wish import open_publisher, open_viewer
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.front.tier import POOL, WORKER_HEADER
from lipcast.server.state import RUNTIME
from tests.fakes import speech_pattern, to_int16

pytestmark = [pytest.mark.usefixtures("loopback_ice"), pytest.mark.slow]

PATTERN = [("silence", 0.5), ("speech", 1.0), ("silence", 0.5)] * 6  # 12 s: longer than either test needs


def settings(**changes: object) -> Settings:
    return Settings(media_workers=2, ice_addresses=("127.0.0.1",), max_sessions=3, **changes)  # type: ignore[arg-type]


def base_url(client: TestClient) -> str:
    return str(client.make_url("")).rstrip("/")


async def wait_for(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def gaps_ms(arrived: list[float]) -> np.ndarray:
    return np.diff(np.asarray(arrived)) * 1000.0


async def test_calls_are_spread_and_session_requests_reach_the_owner(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(settings()))
    pool = client.app[POOL]
    audio = to_int16(speech_pattern(PATTERN))
    url = base_url(client)
    a = await open_publisher(client.session, url, audio, signalling="offer")
    b = await open_publisher(client.session, url, audio, signalling="whip")
    viewer = None
    try:
        owners = {sid: pool.owner(sid).index for sid in (a.session_id, b.session_id)}
        assert sorted(owners.values()) == [0, 1], owners  # one call on each worker
        await asyncio.wait_for(asyncio.gather(a.connected.wait(), b.connected.wait()), 20)

        for peer in (a, b):
            async with client.get(f"/sessions/{peer.session_id}") as response:
                assert response.status == 200
                assert response.headers[WORKER_HEADER] == str(owners[peer.session_id])
                assert (await response.json())["session_id"] == peer.session_id
        # Trickle ICE through the front: the fragment, If-Match and the ETag travel to the owner and back.
        trickle = {"Content-Type": "application/trickle-ice-sdpfrag"}
        fragment = "a=mid:0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n"
        async with client.patch(f"/whip/{b.session_id}", data=fragment, headers=trickle) as response:
            assert response.status == 204 and response.headers[WORKER_HEADER] == str(owners[b.session_id])
            etag = response.headers["ETag"]
        stale = {**trickle, "If-Match": '"stale"'}
        async with client.patch(f"/whip/{b.session_id}", data=fragment, headers=stale) as response:
            assert response.status == 412 and etag in (await response.json())["error"]
        async with client.patch(
            f"/whip/{b.session_id}", data=fragment, headers={**trickle, "If-Match": etag}
        ) as r:
            assert r.status == 204
        async with client.get("/healthz") as response:
            health = await response.json()
        assert health["sessions"] == 2 and health["media_workers"]["count"] == 2
        assert [w["sessions"] for w in health["media_workers"]["workers"]] == [1, 1]
        for w in health["media_workers"]["workers"]:  # each worker's own CPU, per thread group too
            assert w["cpu"]["pid"] == w["pid"] and "MainThread" in w["cpu"]["threads_cpu_s"]
        assert health["cpu"]["pid"] == os.getpid() and "batches" in health["engine"]["stats"]

        viewer = await open_viewer(client.session, url, b.session_id)
        await asyncio.wait_for(viewer.connected.wait(), 20)
        await wait_for(lambda: len(viewer.video.arrived_at) >= 10, 20, "frames at the WHEP viewer")
        async with client.get(f"/sessions/{b.session_id}") as response:
            assert (await response.json())["viewers"]["count"] == 1

        # The capacity is the whole server's: 3 calls over both workers.
        c = await open_publisher(client.session, url, audio, signalling="offer")
        try:
            with pytest.raises(Exception, match="503"):
                await open_publisher(client.session, url, audio, signalling="offer")
            async with client.get("/readyz") as response:
                assert response.status == 503
                assert (await response.json())["reason"] == "no session capacity left"
        finally:
            await c.close(delete=True)

        async with client.delete(f"/sessions/{a.session_id}") as response:
            assert response.status == 204
            assert response.headers[WORKER_HEADER] == str(owners[a.session_id])
        async with client.get(f"/sessions/{a.session_id}") as response:
            assert response.status == 404
        async with client.delete(f"/whip/{b.session_id}") as response:
            assert response.status == 200
        await wait_for(lambda: pool.sessions_total == 0, 10, "both sessions to be gone")
        async with client.get("/metrics") as response:
            text = await response.text()
        assert 'lipcast_sessions_created_total{process="worker-0"}' in text
        assert 'lipcast_sessions_created_total{process="worker-1"}' in text
        assert 'lipcast_media_workers{process="front"} 2.0' in text
    finally:
        if viewer is not None:
            await viewer.close(delete=False)
        await a.close(delete=False)
        await b.close(delete=False)


async def test_a_killed_worker_loses_only_its_call(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(settings()))
    pool = client.app[POOL]
    audio = to_int16(speech_pattern(PATTERN))
    url = base_url(client)
    doomed = await open_publisher(client.session, url, audio, signalling="offer")
    survivor = await open_publisher(client.session, url, audio, signalling="offer")
    try:
        await asyncio.wait_for(asyncio.gather(doomed.connected.wait(), survivor.connected.wait()), 20)
        await wait_for(lambda: len(survivor.video.arrived_at) >= 25, 20, "the survivor's first second")
        victim = pool.owner(doomed.session_id)
        assert pool.owner(survivor.session_id) is not victim
        killed_at = time.monotonic()
        assert victim.process.pid is not None
        os.kill(victim.process.pid, signal.SIGKILL)

        await wait_for(lambda: pool.restarts["crashed"] == 1, 10, "the front to notice the crash")
        assert pool.sessions_lost == 1 and pool.sessions_total == 1
        async with client.get(f"/sessions/{doomed.session_id}") as response:
            assert response.status == 404
        await asyncio.sleep(4.0)  # the survivor's call goes on meanwhile

        arrived = [t for t in survivor.video.arrived_at if t >= killed_at]
        window_s = time.monotonic() - killed_at
        fps = len(arrived) / window_s
        gaps = gaps_ms(arrived)
        # 25 fps sent; margins for a loaded 2-core machine that also restarts a worker meanwhile.
        assert fps >= 18.0, fps
        assert gaps.max() < 500.0, gaps.max()
        frames = [m["frame"] for t, m in survivor.meta if t >= killed_at]
        assert frames == sorted(frames) and len(frames) > 50

        await wait_for(lambda: all(w.ready for w in pool.live()), 120, "the replacement worker")
        async with client.get("/metrics") as response:
            text = await response.text()
        assert 'lipcast_media_worker_restarts_total{process="front",reason="crashed"} 1.0' in text
        assert 'lipcast_media_worker_sessions_lost_total{process="front"} 1.0' in text
        async with client.get("/readyz") as response:
            assert response.status == 200
    finally:
        await doomed.close(delete=False)
        await survivor.close(delete=True)


async def test_one_engine_per_device_serves_the_workers_bound_to_it(aiohttp_client) -> None:
    # Two CPU "devices" stand for two GPUs: an engine each, worker i bound to engine i % 2.
    app = create_app(settings(gpus=("cpu", "cpu"), render_in="engine"))
    client = await aiohttp_client(app)
    pool = client.app[POOL]
    group = client.app[RUNTIME].engine
    assert isinstance(group, EngineGroup) and len(group.engines) == 2
    assert [w.engine_index for w in pool.live()] == [0, 1]
    audio = to_int16(speech_pattern(PATTERN))
    url = base_url(client)
    a = await open_publisher(client.session, url, audio, signalling="offer")
    b = await open_publisher(client.session, url, audio, signalling="offer")
    try:
        assert {pool.owner(a.session_id).engine_index, pool.owner(b.session_id).engine_index} == {0, 1}
        await asyncio.wait_for(asyncio.gather(a.connected.wait(), b.connected.wait()), 20)
        # Both calls speak from 0.5 s on: each engine renders its own call's frames.
        await wait_for(lambda: all(e.stats.frames >= 10 for e in group.engines), 30, "renders on both")
        async with client.get("/healthz") as response:
            health = await response.json()
        devices = health["engine"]["devices"]
        assert [d["device"] for d in devices] == ["cpu/0", "cpu/1"]
        assert [d["sessions"] for d in devices] == [1, 1] and all(d["frames"] >= 10 for d in devices)
        assert [w["engine"] for w in health["media_workers"]["workers"]] == [0, 1]
        async with client.get("/metrics") as response:
            text = await response.text()
        assert 'lipcast_device_engine_frames_total{process="front",device="cpu/1"}' in text
    finally:
        await a.close(delete=True)
        await b.close(delete=True)
