"""The offers other stacks send, from an in-process aiortc peer shaped like them: RSA certificates and
``a=setup`` either way (GStreamer), no candidates with or without ``a=end-of-candidates`` (OBS through
libdatachannel), only mDNS names (browsers without a granted microphone), candidates sent only by PATCH
(trickling clients). Each connects and carries audio; the internals lipcast.streaming.interop patches are
checked to be where it expects them."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable

import aioice
import aiortc
import pytest
from aiohttp.test_utils import TestClient
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack
from aiortc.rtcdtlstransport import SRTP_AES128_CM_SHA1_80, RTCCertificate, generate_certificate
from cryptography.hazmat.primitives.asymmetric import rsa

from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.sessions import Session
from lipcast.server.state import RUNTIME
from lipcast.streaming import interop

pytestmark = pytest.mark.usefixtures("loopback_ice")

SDP = {"Content-Type": "application/sdp"}
TRICKLE = "application/trickle-ice-sdpfrag"
CANDIDATE = re.compile(r"^a=candidate:.*$\r?\n?", re.MULTILINE)
END = re.compile(r"^a=end-of-candidates\r?\n?", re.MULTILINE)


def without_candidates(sdp: str, *, end_of_candidates: bool) -> str:
    """OBS's shape: the offer is sent before gathering, no candidates, the discard address."""
    sdp = END.sub("", CANDIDATE.sub("", sdp))
    sdp = re.sub(r"^c=IN IP4 .*$", "c=IN IP4 0.0.0.0", sdp, flags=re.MULTILINE)
    sdp = re.sub(r"^(m=\w+) \d+ ", r"\1 9 ", sdp, flags=re.MULTILINE)
    if end_of_candidates:
        sdp = re.sub(r"^(a=mid:.*)$", "\\1\r\na=end-of-candidates", sdp, flags=re.MULTILINE)
    return sdp


def mdns_only(sdp: str) -> str:
    """A browser's shape without microphone permission: host candidates named ``<uuid>.local``."""
    name = f"{uuid.uuid4()}.local"
    return re.sub(r"^(a=candidate:\S+ \d+ \S+ \d+ )127\.0\.0\.1 ", rf"\g<1>{name} ", sdp, flags=re.MULTILINE)


def with_setup(setup: str) -> Callable[[str], str]:
    return lambda sdp: sdp.replace("a=setup:actpass", f"a=setup:{setup}")


def rsa_certificate() -> RTCCertificate:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return RTCCertificate(key=key, cert=generate_certificate(key))  # type: ignore[arg-type]


class Publisher:
    """A WHIP client with a silent microphone whose offer goes through ``shape`` on its way out."""

    def __init__(self, certificate: RTCCertificate | None = None) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        if certificate is not None:
            self.pc._RTCPeerConnection__certificates = [certificate]  # type: ignore[attr-defined]
        self.pc.addTrack(AudioStreamTrack())
        self.pc.addTransceiver("video", direction="sendonly")  # as OBS: video that lipcast does not use
        self.answer = ""
        self.location = ""
        self.etag = ""
        self.answer_ms = 0.0

    async def publish(self, client: TestClient, shape: Callable[[str], str]) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = shape(self.pc.localDescription.sdp)
        start = time.perf_counter()
        response = await client.post("/whip", data=offer, headers=SDP)
        self.answer_ms = (time.perf_counter() - start) * 1000
        assert response.status == 201, await response.text()
        self.answer = await response.text()
        self.location, self.etag = response.headers["Location"], response.headers["ETag"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=self.answer, type="answer"))
        return offer

    def session(self, client: TestClient) -> Session:
        return client.app[RUNTIME].sessions.get(self.location.rsplit("/", 1)[-1])

    async def wait_for_audio(self, client: TestClient, timeout_s: float = 15.0) -> Session:
        """Until both ends are connected and the server has decoded half a second of the voice."""
        session = self.session(client)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ingest = session.ingest
            if self.pc.connectionState == "connected" and ingest is not None and ingest.frames_received > 25:
                return session
            assert self.pc.connectionState != "failed"
            await asyncio.sleep(0.05)
        raise AssertionError(
            f"no audio: client {self.pc.connectionState}, server {session.pc.connectionState}"
        )

    async def close(self, client: TestClient) -> None:
        await client.delete(self.location)
        await self.pc.close()


@pytest.fixture
async def client(aiohttp_client) -> TestClient:
    return await aiohttp_client(create_app(Settings(connect_timeout_s=10)))


def setup_of(sdp: str) -> set[str]:
    return set(re.findall(r"^a=setup:(\w+)", sdp, flags=re.MULTILINE))


# ---- DTLS ----


async def test_an_actpass_offer_is_answered_passive_and_an_rsa_client_connects(client) -> None:
    publisher = Publisher(rsa_certificate())
    await publisher.publish(client, lambda sdp: sdp)
    assert setup_of(publisher.answer) == {"passive"}  # the client picks the suite for its certificate
    session = await publisher.wait_for_audio(client)
    assert session.pc.getTransceivers()[0].receiver.transport._role == "server"
    await publisher.close(client)


@pytest.mark.parametrize("certificate", ["rsa", "ecdsa"])
async def test_lipcast_as_dtls_client_offers_rsa_and_ecdsa_suites(client, certificate: str) -> None:
    """A ``passive`` offer makes lipcast the DTLS client; the peer's certificate picks the suite."""
    publisher = Publisher(rsa_certificate() if certificate == "rsa" else None)
    await publisher.publish(client, with_setup("passive"))
    assert setup_of(publisher.answer) == {"active"}
    await publisher.wait_for_audio(client)
    await publisher.close(client)


def test_the_dtls_suites_cover_both_certificate_kinds() -> None:
    interop.use_common_dtls_suites()
    names = {c.decode() for c in _context_ciphers(RTCCertificate.generateCertificate())}
    assert {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256"} <= names


def _context_ciphers(certificate: RTCCertificate) -> list[bytes]:
    from OpenSSL import SSL

    context = certificate._create_ssl_context(srtp_profiles=[SRTP_AES128_CM_SHA1_80])
    connection = SSL.Connection(context)
    return [c.encode() for c in connection.get_cipher_list()]


# ---- ICE ----


@pytest.mark.parametrize("end_of_candidates", [True, False], ids=["end-of-candidates", "open"])
async def test_an_obs_shaped_offer_without_candidates_connects(client, end_of_candidates: bool) -> None:
    publisher = Publisher()
    offer = await publisher.publish(
        client, lambda sdp: without_candidates(sdp, end_of_candidates=end_of_candidates)
    )
    assert "a=candidate" not in offer and ("a=end-of-candidates" in offer) == end_of_candidates
    assert "a=candidate" in publisher.answer  # lipcast's own candidates, gathered for every component
    assert "a=recvonly" in publisher.answer.split("m=video")[1]  # OBS's video: taken, not decoded
    session = await publisher.wait_for_audio(client)
    remote = session.pc.getTransceivers()[0].receiver.transport.transport.getRemoteCandidates()
    assert [c.type for c in remote] == ["prflx"]  # learnt from the client's checks
    await publisher.close(client)


async def test_an_mdns_only_offer_is_answered_at_once_and_connects(client) -> None:
    publisher = Publisher()
    offer = await publisher.publish(client, mdns_only)
    assert ".local" in offer and "127.0.0.1 " not in offer.split("m=audio")[1].split("a=candidate", 1)[1]
    assert "a=candidate" in publisher.answer
    print(f"mDNS-only offer answered in {publisher.answer_ms:.1f} ms")
    assert publisher.answer_ms < 100.0  # aioice's own resolution waits 1 s first
    await publisher.wait_for_audio(client)
    await publisher.close(client)


async def test_a_client_that_trickles_its_candidates_by_patch_connects(client) -> None:
    publisher = Publisher()
    await publisher.publish(client, lambda sdp: without_candidates(sdp, end_of_candidates=False))
    candidates = [
        line for line in publisher.pc.localDescription.sdp.splitlines() if line.startswith("a=cand")
    ]
    ufrag = re.search(r"^a=ice-ufrag:(\S+)", publisher.pc.localDescription.sdp, re.MULTILINE)
    assert candidates and ufrag is not None
    fragment = "\r\n".join(
        [f"a=ice-ufrag:{ufrag.group(1)}", "m=audio 9 UDP/TLS/RTP/SAVPF 0", "a=mid:0", *candidates]
    )
    fragment += "\r\na=end-of-candidates\r\n"
    patch = await client.patch(
        publisher.location, data=fragment, headers={"Content-Type": TRICKLE, "If-Match": publisher.etag}
    )
    assert patch.status == 204, await patch.text()
    session = await publisher.wait_for_audio(client)
    remote = session.pc.getTransceivers()[0].receiver.transport.transport.getRemoteCandidates()
    assert "host" in {c.type for c in remote}  # the trickled candidate, not only what checks taught
    await publisher.close(client)


# ---- the internals lipcast.streaming.interop reaches into ----


async def test_the_patched_internals_are_where_interop_expects_them() -> None:
    """Fails when aiortc or aioice change what :mod:`lipcast.streaming.interop` patches (written for aiortc
    1.16.0 and aioice 0.13.0): re-check the patches against the new version, then update this test."""
    assert aiortc.__version__ == "1.16.0" and aioice.__version__ == "0.13.0"
    assert callable(RTCCertificate._create_ssl_context)
    interop.use_interop()
    assert getattr(RTCCertificate._create_ssl_context, interop.PATCHED)
    ice_transport = aiortc.rtcicetransport.RTCIceTransport
    assert getattr(ice_transport.addRemoteCandidate, interop.PATCHED)
    connection = aioice.Connection(ice_controlling=False)
    assert hasattr(connection, "_remote_candidates_end") and connection.remote_candidates == []
    pc = RTCPeerConnection()
    transceiver = pc.addTransceiver("audio")
    assert transceiver.receiver.transport._role == "auto" and hasattr(
        transceiver.receiver.transport, "_set_role"
    )
    await pc.close()
