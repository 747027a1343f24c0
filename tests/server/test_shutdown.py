"""SIGTERM drains: the server stops taking calls, lets live ones end (up to a deadline), then exits."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

pytestmark = [pytest.mark.usefixtures("loopback_ice"), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_server(drain_timeout_s: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lipcast",
            "serve",
            "--port",
            str(port),
            "--ice-address",
            "127.0.0.1",
            "--drain-timeout-s",
            str(drain_timeout_s),
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(f"{url}/readyz") as r:
                    if r.status == 200:
                        return proc, url
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not become ready")


async def connect(http: aiohttp.ClientSession, url: str) -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.addTransceiver("video", direction="recvonly")
    connected = asyncio.Event()
    pc.on("connectionstatechange", lambda: connected.set() if pc.connectionState == "connected" else None)
    await pc.setLocalDescription(await pc.createOffer())
    async with http.post(f"{url}/offer", json={"sdp": pc.localDescription.sdp, "type": "offer"}) as r:
        answer = await r.json()
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
    await asyncio.wait_for(connected.wait(), 10)
    return pc, answer["session_id"]


async def wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    start = time.monotonic()
    while proc.poll() is None:
        if time.monotonic() - start > timeout_s:
            proc.kill()
            raise AssertionError("server did not exit")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def test_sigterm_drains_then_exits_when_the_last_call_ends() -> None:
    proc, url = await start_server(drain_timeout_s=20)
    try:
        async with aiohttp.ClientSession() as http:
            pc, session_id = await connect(http, url)
            os.kill(proc.pid, signal.SIGTERM)
            await asyncio.sleep(0.3)
            async with http.get(f"{url}/readyz") as r:
                assert r.status == 503 and (await r.json())["reason"] == "draining"
            async with http.post(f"{url}/offer", json={"sdp": "v=0", "type": "offer"}) as r:
                assert r.status == 503
            assert proc.poll() is None  # the live call holds the server up ...
            async with http.delete(f"{url}/sessions/{session_id}") as r:
                assert r.status == 204
            assert await wait_exit(proc, 10) < 5  # ... and its end lets it go, long before the deadline
            assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
            await pc.close()
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_sigterm_closes_calls_at_the_drain_deadline() -> None:
    proc, url = await start_server(drain_timeout_s=1.0)
    try:
        async with aiohttp.ClientSession() as http:
            pc, _ = await connect(http, url)
            started = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            await wait_exit(proc, 15)
            assert 0.9 <= time.monotonic() - started < 8
            assert proc.returncode == 0
            await pc.close()
    finally:
        if proc.poll() is None:
            proc.kill()
