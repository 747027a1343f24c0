"""Reliability: a client that vanishes is cleaned up; 200 connect/disconnect cycles leak nothing."""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME

pytestmark = [pytest.mark.usefixtures("loopback_ice"), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
ICE_CONSENT_TIMEOUT_S = 6 * 5 * 1.2  # aioice: 6 failed consent checks, 5 s apart (+-20 % jitter)


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


async def test_a_vanished_client_is_cleaned_up_within_the_consent_timeout(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings()))
    runtime = client.app[RUNTIME]
    url = str(client.make_url("")).rstrip("/")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.server.vanishing_client", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)  # type: ignore[union-attr]
        session_id = line.strip()
        assert session_id in runtime.sessions.sessions
        os.kill(proc.pid, signal.SIGKILL)  # no DELETE, no DTLS close, no ICE: it is simply gone
        killed = time.monotonic()
        while session_id in runtime.sessions.sessions:
            assert time.monotonic() - killed < ICE_CONSENT_TIMEOUT_S + 5, "session not cleaned up"
            await asyncio.sleep(0.25)
        elapsed = time.monotonic() - killed
        print(f"vanished client cleaned up after {elapsed:.1f} s")
        assert runtime.engine.queue_depth == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def one_cycle(client, url: str) -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.addTransceiver("video", direction="recvonly")
    connected = asyncio.Event()
    pc.on("connectionstatechange", lambda: connected.set() if pc.connectionState == "connected" else None)
    try:
        await pc.setLocalDescription(await pc.createOffer())
        response = await client.post("/offer", json={"sdp": pc.localDescription.sdp, "type": "offer"})
        answer = await response.json()
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        await asyncio.wait_for(connected.wait(), 15)
        deleted = await client.delete(f"/sessions/{answer['session_id']}")
        assert deleted.status == 204
    finally:
        await pc.close()


async def test_connect_disconnect_soak_leaks_nothing(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings(max_sessions=8)))
    runtime = client.app[RUNTIME]
    url = str(client.make_url("")).rstrip("/")
    cycles, concurrency, warmup = 200, 4, 20

    async def settle() -> tuple[int, int, float]:
        for _ in range(100):
            if not runtime.sessions.sessions:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        gc.collect()
        tasks = sum(1 for t in asyncio.all_tasks() if not t.done())
        return tasks, open_files(), rss_mb()

    done = 0
    baseline = None
    started = time.monotonic()
    while done < cycles:
        await asyncio.gather(*(one_cycle(client, url) for _ in range(concurrency)))
        done += concurrency
        if done == warmup:
            baseline = await settle()
    tasks, files, rss = await settle()
    assert baseline is not None
    print(
        f"soak: {cycles} cycles in {time.monotonic() - started:.1f} s; tasks {baseline[0]} -> {tasks}, "
        f"open files {baseline[1]} -> {files}, RSS {baseline[2]:.1f} -> {rss:.1f} MB"
    )
    assert runtime.sessions.sessions == {} and len(runtime.sessions) == 0
    assert runtime.sessions.created_total == cycles
    assert tasks <= baseline[0] + 2
    assert files <= baseline[1] + 4
    assert rss - baseline[2] < 50.0
