"""Operations: metrics, liveness and readiness, limits (body size, session time, CORS), drain."""

from __future__ import annotations

import asyncio

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from lipcast.probe.client import call
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from tests.fakes import speech_pattern, to_int16
from tests.waiting import eventually

pytestmark = pytest.mark.usefixtures("loopback_ice")


async def offer_body() -> tuple[RTCPeerConnection, dict]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, {"sdp": pc.localDescription.sdp, "type": "offer"}


def metric(text: str, name: str, labels: str = "") -> float:
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    raise AssertionError(f"{prefix!r} not in metrics")


@pytest.mark.slow
async def test_metrics_follow_a_call(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings()))
    before = await (await client.get("/metrics")).text()
    assert metric(before, "lipcast_sessions_active") == 0
    assert metric(before, "lipcast_ready") == 1
    sent = to_int16(speech_pattern([("silence", 0.5), ("speech", 1.0), ("silence", 0.5)]))
    await call(str(client.make_url("")).rstrip("/"), sent, tail_s=0.3, http=client.session)
    await eventually(lambda: not client.app[RUNTIME].sessions.sessions, "closed")
    text = await (await client.get("/metrics")).text()
    assert metric(text, "lipcast_sessions_created_total") == 1
    assert metric(text, "lipcast_sessions_active") == 0
    assert metric(text, "lipcast_frames_out_total") >= 40
    assert metric(text, "lipcast_frames_in_total") >= 80  # 20 ms packets
    assert metric(text, "lipcast_frames_rendered_total") > 0
    assert metric(text, "lipcast_engine_frames_total") > 0
    for stage in ("features", "compose", "render", "encode_video", "encode_audio"):
        assert metric(text, "lipcast_stage_seconds_count", f'stage="{stage}"') > 0, stage
    assert metric(text, "lipcast_input_buffer_depth_ms_count") >= 40
    assert 'lipcast_engine_batch_size_total{size="1"}' in text


async def test_liveness_readiness_and_capacity(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings(max_sessions=1)))
    assert (await client.get("/healthz")).status == 200
    ready = await client.get("/readyz")
    assert ready.status == 200 and (await ready.json())["ready"] is True
    pc, body = await offer_body()
    answer = await client.post("/offer", json=body)
    assert answer.status == 200
    full = await client.get("/readyz")
    assert full.status == 503 and (await full.json())["reason"] == "no session capacity left"
    assert "Retry-After" in full.headers
    pc2, body2 = await offer_body()
    assert (await client.post("/offer", json=body2)).status == 503
    await client.delete(f"/sessions/{(await answer.json())['session_id']}")
    await pc.close()
    await pc2.close()
    assert (await client.get("/readyz")).status == 200
    text = await (await client.get("/metrics")).text()
    assert metric(text, "lipcast_sessions_refused_total", 'reason="capacity"') == 1


async def test_draining_refuses_new_calls_but_lets_live_ones_end(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings()))
    runtime = client.app[RUNTIME]
    pc, body = await offer_body()
    answer = await (await client.post("/offer", json=body)).json()
    drain = asyncio.create_task(runtime.sessions.drain(timeout_s=5.0))
    await asyncio.sleep(0.05)
    readyz = await client.get("/readyz")
    assert readyz.status == 503 and (await readyz.json())["reason"] == "draining"
    pc2, body2 = await offer_body()
    refused = await client.post("/offer", json=body2)
    assert refused.status == 503 and "shutting down" in (await refused.json())["error"]
    assert not drain.done()  # the live call goes on ...
    assert (await client.delete(f"/sessions/{answer['session_id']}")).status == 204  # ... until it ends
    assert await asyncio.wait_for(drain, 2.0) == 0
    await pc.close()
    await pc2.close()


async def test_drain_deadline_closes_what_is_left(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings()))
    runtime = client.app[RUNTIME]
    pc, body = await offer_body()
    assert (await client.post("/offer", json=body)).status == 200
    assert await runtime.sessions.drain(timeout_s=0.2) == 1
    assert runtime.sessions.sessions == {}
    await pc.close()


async def test_session_time_limit(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings(max_session_s=0.3)))
    pc, body = await offer_body()
    assert (await client.post("/offer", json=body)).status == 200
    await eventually(lambda: not client.app[RUNTIME].sessions.sessions, "closed at the time limit")
    await pc.close()


async def test_request_body_limit(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings()))
    response = await client.post(
        "/offer", data=b"x" * (2 << 20), headers={"Content-Type": "application/json"}
    )
    assert response.status == 413
    assert "error" in await response.json()


async def test_cors_same_origin_by_default_and_allowlist(aiohttp_client) -> None:
    closed = await aiohttp_client(create_app(Settings()))
    page = await closed.get("/config", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in page.headers
    whip = await closed.options("/whip", headers={"Origin": "https://tool.example"})
    assert whip.status == 204 and whip.headers["Access-Control-Allow-Origin"] == "*"

    allow = Settings(cors_origins=("https://app.example",))
    opened = await aiohttp_client(create_app(allow))
    ok = await opened.get("/config", headers={"Origin": "https://app.example"})
    assert ok.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "Origin" in ok.headers.getall("Vary")
    other = await opened.get("/config", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers
    preflight = await opened.options(
        "/offer", headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    )
    assert preflight.status == 204 and "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://app.example"
