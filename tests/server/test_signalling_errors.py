"""Bad input gets a clear JSON error and leaves no session or task behind."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient
from aiortc import RTCConfiguration, RTCPeerConnection

from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from tests.waiting import eventually

pytestmark = pytest.mark.usefixtures("loopback_ice")


async def client_offer(audio: bool = True, video: bool = True) -> tuple[RTCPeerConnection, dict]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    if audio:
        pc.addTransceiver("audio", direction="sendrecv")
    if video:
        pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, {"sdp": pc.localDescription.sdp, "type": "offer"}


@pytest.fixture
async def client(aiohttp_client) -> TestClient:
    return await aiohttp_client(create_app(Settings(max_sessions=1, connect_timeout_s=5)))


def live_tasks() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if not t.done()}


async def assert_nothing_left(client: TestClient, before: set[asyncio.Task]) -> None:
    runtime = client.app[RUNTIME]
    assert runtime.sessions.sessions == {} and len(runtime.sessions) == 0
    for _ in range(20):
        leaked = {
            t for t in live_tasks() - before if "lipcast" in repr(t.get_coro()) or "stream" in t.get_name()
        }
        if not leaked:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"tasks left behind: {leaked}")


@pytest.mark.parametrize(
    "body, content_type, message",
    [
        (b"not json", "application/json", "not valid JSON"),
        (b"[1, 2]", "application/json", "JSON object"),
        (b'{"type": "offer"}', "application/json", "'sdp'"),
        (b'{"sdp": "v=0\\r\\n", "type": "answer"}', "application/json", "'type'"),
        (b'{"sdp": "hello", "type": "offer"}', "application/json", "malformed SDP"),
        (b'{"sdp": "v=0\\r\\nm=audio x\\r\\n", "type": "offer"}', "application/json", "malformed SDP"),
        (b'{"sdp": "v=0\\r\\n", "type": "offer", "avatar": 3}', "application/json", "'avatar'"),
    ],
)
async def test_bad_offers_get_400_with_a_message(client, body, content_type, message) -> None:
    before = live_tasks()
    response = await client.post("/offer", data=body, headers={"Content-Type": content_type})
    assert response.status == 400
    assert message in (await response.json())["error"]
    await assert_nothing_left(client, before)


async def test_offer_without_video_is_refused(client) -> None:
    before = live_tasks()
    pc, body = await client_offer(video=False)
    response = await client.post("/offer", json=body)
    assert response.status == 400
    assert "receive video" in (await response.json())["error"]
    await pc.close()
    await assert_nothing_left(client, before)


async def test_unknown_avatar_is_404(client) -> None:
    before = live_tasks()
    pc, body = await client_offer()
    response = await client.post("/offer", json={**body, "avatar": "nobody"})
    assert response.status == 404
    assert "nobody" in (await response.json())["error"]
    await pc.close()
    await assert_nothing_left(client, before)


async def test_over_the_limit_is_503_with_retry_after_and_delete_frees_the_slot(client) -> None:
    before = live_tasks()
    pc1, body1 = await client_offer()
    first = await client.post("/offer", json=body1)
    assert first.status == 200
    session_id = (await first.json())["session_id"]
    pc2, body2 = await client_offer()
    second = await client.post("/offer", json=body2)
    assert second.status == 503
    assert int(second.headers["Retry-After"]) > 0
    assert "sessions are in use" in (await second.json())["error"]
    assert len(client.app[RUNTIME].sessions) == 1
    deleted = await client.delete(f"/sessions/{session_id}")
    assert deleted.status == 204
    assert (await client.delete(f"/sessions/{session_id}")).status == 404
    await pc1.close()
    await pc2.close()
    await assert_nothing_left(client, before)


async def test_a_session_that_never_connects_is_closed(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings(connect_timeout_s=0.3)))
    pc, body = await client_offer()
    response = await client.post("/offer", json=body)
    assert response.status == 200
    await pc.close()  # the client vanishes before ICE completes
    await eventually(lambda: not client.app[RUNTIME].sessions.sessions, "closed after the connect timeout")


async def test_health_config_and_avatars(client) -> None:
    health = await (await client.get("/healthz")).json()
    assert health["status"] == "ok" and health["ready"] and health["backend"] == "builtin"
    assert health["device"] == "cpu" and "torch" in health
    assert (await (await client.get("/config")).json()) == {
        "ice_servers": [],
        "max_output_size": "1920x1080",
        "video_codecs": ["vp8", "h264"],
    }
    avatars = await (await client.get("/avatars")).json()
    assert avatars["default"] == "astronaut"
    assert [a["name"] for a in avatars["avatars"]] == ["astronaut"]
    preview = await client.get(avatars["avatars"][0]["preview_url"])
    assert preview.status == 200 and preview.content_type == "image/png"
    assert (await client.get("/avatars/nobody/preview.png")).status == 404
    page = await client.get("/")
    assert page.status == 200 and "<video" in await page.text()
