"""The HTTP details of WHIP (RFC 9725) and WHEP (draft-ietf-wish-whep) that clients others wrote rely on:
media types without parameters, ``405`` + ``Allow``, ``OPTIONS``, ``ETag`` / ``If-Match`` on trickle PATCH
(``204``, ``412``), ICE restarts refused with ``422``, the token on every session route, JSON error bodies."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient
from aiortc import RTCConfiguration, RTCPeerConnection

from lipcast.server.app import create_app
from lipcast.server.config import IceServer, Settings
from lipcast.server.state import RUNTIME

pytestmark = pytest.mark.usefixtures("loopback_ice")

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SDP = {"Content-Type": "application/sdp"}
TRICKLE = "application/trickle-ice-sdpfrag"
STUN = IceServer(("stun:stun.example.org:3478",))


async def offer(audio: str = "sendonly", video: str | None = None) -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction=audio)
    if video is not None:
        pc.addTransceiver("video", direction=video)
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


@pytest.fixture
async def client(aiohttp_client) -> TestClient:
    settings = Settings(auth_token=TOKEN, connect_timeout_s=5, ice_servers=(STUN,))
    return await aiohttp_client(create_app(settings))


@pytest.fixture
async def whip(client: TestClient):
    """A WHIP session: (its peer, the 201 response)."""
    pc, sdp = await offer()
    response = await client.post("/whip", data=sdp, headers={**SDP, **AUTH})
    assert response.status == 201
    yield pc, response
    await client.delete(response.headers["Location"], headers=AUTH)
    await pc.close()


async def error_of(response) -> str:
    assert response.content_type == "application/json"
    return (await response.json())["error"]


async def test_answers_are_application_sdp_without_parameters(client, whip) -> None:
    _, response = whip
    assert response.headers["Content-Type"] == "application/sdp"
    assert response.headers["Location"].startswith("/whip/")
    assert response.headers["ETag"].startswith('"') and response.headers["ETag"].endswith('"')
    assert response.headers.getall("Link") == ['<stun:stun.example.org:3478>; rel="ice-server"']
    session_id = response.headers["Location"].rsplit("/", 1)[-1]
    viewer_pc, sdp = await offer("recvonly", "recvonly")
    viewer = await client.post(f"/whep/{session_id}", data=sdp, headers={**SDP, **AUTH})
    assert viewer.status == 201
    assert viewer.headers["Content-Type"] == "application/sdp"
    assert viewer.headers["Location"].startswith(f"/whep/{session_id}/viewers/")
    assert "ETag" in viewer.headers and viewer.headers.getall("Link")
    await viewer_pc.close()


@pytest.mark.parametrize(
    "method, path, allowed",
    [
        ("GET", "/whip", "OPTIONS,POST"),
        ("PUT", "/whip", "OPTIONS,POST"),
        ("DELETE", "/whip", "OPTIONS,POST"),
        ("GET", "/whip/{id}", "DELETE,OPTIONS,PATCH"),
        ("POST", "/whip/{id}", "DELETE,OPTIONS,PATCH"),
        ("PUT", "/whip/{id}", "DELETE,OPTIONS,PATCH"),
        ("GET", "/whep/{id}", "OPTIONS,POST"),
        ("PATCH", "/whep/{id}", "OPTIONS,POST"),
        ("GET", "/whep/{id}/viewers/v", "DELETE,OPTIONS,PATCH"),
    ],
)
async def test_other_methods_are_405_with_allow(client, whip, method, path, allowed) -> None:
    session_id = whip[1].headers["Location"].rsplit("/", 1)[-1]
    response = await client.request(method, path.format(id=session_id), headers=AUTH)
    assert response.status == 405
    assert response.headers["Allow"] == allowed
    assert f"{method} is not allowed" in await error_of(response)


async def test_options_names_the_methods_and_the_ice_servers(client, whip) -> None:
    endpoint = await client.options("/whip")  # no token: OPTIONS is never authenticated
    assert endpoint.status == 204
    assert endpoint.headers["Allow"] == "OPTIONS, POST"
    assert endpoint.headers["Access-Control-Allow-Methods"] == "OPTIONS, POST"
    assert endpoint.headers["Accept-Post"] == "application/sdp"
    assert endpoint.headers.getall("Link") == ['<stun:stun.example.org:3478>; rel="ice-server"']
    location = whip[1].headers["Location"]
    resource = await client.options(location)
    assert resource.status == 204
    assert resource.headers["Allow"] == "OPTIONS, PATCH, DELETE"
    assert resource.headers["Accept-Patch"] == TRICKLE
    assert "Link" not in resource.headers
    session_id = location.rsplit("/", 1)[-1]
    assert (await client.options(f"/whep/{session_id}")).headers["Allow"] == "OPTIONS, POST"


async def test_trickle_patch_checks_its_etag_and_media_type(client, whip) -> None:
    pc, response = whip
    location, etag = response.headers["Location"], response.headers["ETag"]
    fragment = "a=mid:0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host\r\n"
    mismatch = await client.patch(
        location, data=fragment, headers={**AUTH, "Content-Type": TRICKLE, "If-Match": '"x"'}
    )
    assert mismatch.status == 412 and etag in await error_of(mismatch)
    wrong_type = await client.patch(location, data=fragment, headers={**AUTH, **SDP, "If-Match": etag})
    assert wrong_type.status == 415 and TRICKLE in await error_of(wrong_type)
    bad = await client.patch(
        location, data="a=candidate:nonsense\r\n", headers={**AUTH, "Content-Type": TRICKLE}
    )
    assert bad.status == 400 and "malformed ICE fragment" in await error_of(bad)
    unknown_mid = await client.patch(
        location, data="a=mid:7\r\n" + fragment.split("\r\n", 1)[1], headers={**AUTH, "Content-Type": TRICKLE}
    )
    assert unknown_mid.status == 400 and "mid '7'" in await error_of(unknown_mid)
    ok = await client.patch(
        location, data=fragment, headers={**AUTH, "Content-Type": TRICKLE, "If-Match": etag}
    )
    assert ok.status == 204 and ok.headers["ETag"] == etag
    # (this offer ended its candidates, so the candidate is ignored, RFC 8838 section 14; that trickled
    # candidates join the connection is tests/server/test_interop_offers.py's)
    assert (await client.patch(location, data=fragment, headers={"Content-Type": TRICKLE})).status == 401


async def test_ice_restarts_are_refused_with_422(client, whip) -> None:
    _, response = whip
    location, etag = response.headers["Location"], response.headers["ETag"]
    restart = "a=ice-ufrag:new1\r\na=ice-pwd:0123456789abcdef012345\r\n"
    restart += "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n"
    star = await client.patch(
        location, data=restart, headers={**AUTH, "Content-Type": TRICKLE, "If-Match": "*"}
    )
    assert star.status == 422 and "ICE restarts are not supported" in await error_of(star)
    other = await client.patch(
        location, data=restart, headers={**AUTH, "Content-Type": TRICKLE, "If-Match": etag}
    )
    assert other.status == 422 and "POST a new offer" in await error_of(other)
    assert client.app[RUNTIME].sessions.get(location.rsplit("/", 1)[-1]).pc.connectionState != "closed"


async def test_every_session_route_needs_the_token(client, whip) -> None:
    location = whip[1].headers["Location"]
    session_id = location.rsplit("/", 1)[-1]
    for method, path in (
        ("GET", f"/sessions/{session_id}"),
        ("DELETE", f"/sessions/{session_id}"),
        ("DELETE", location),
        ("PATCH", location),
        ("POST", f"/whep/{session_id}"),
        ("DELETE", f"/whep/{session_id}/viewers/v"),
        ("PATCH", f"/whep/{session_id}/viewers/v"),
        ("POST", "/whip"),
        ("POST", "/offer"),
    ):
        response = await client.request(method, path)
        assert response.status == 401, (method, path)
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="lipcast"'
        assert "Bearer" in await error_of(response)
    stats = await client.get(f"/sessions/{session_id}", headers=AUTH)
    assert stats.status == 200 and (await stats.json())["signalling"] == "whip"


async def test_an_unused_video_section_is_answered_recvonly(client) -> None:
    """OBS sends video that lipcast does not use: answered recvonly (taken and dropped), not inactive."""
    pc, sdp = await offer("sendonly", "sendonly")
    response = await client.post("/whip", data=sdp, headers={**SDP, **AUTH})
    assert response.status == 201
    video = (await response.text()).split("m=video", 1)[1]
    assert "a=recvonly" in video and "a=inactive" not in video
    await client.delete(response.headers["Location"], headers=AUTH)
    await pc.close()
