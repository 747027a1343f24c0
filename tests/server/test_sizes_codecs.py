"""Per-session output size and video codec: asked for on /offer, WHIP and WHEP, capped by the server,
negotiated from the offer; viewers share one encoder per (size, codec); refusals name the field."""

from __future__ import annotations

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver

from lipcast.probe.client import CallOptions, call
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from lipcast.streaming.sizes import OutputSize
from tests.fakes import speech_pattern, to_int16

pytestmark = [pytest.mark.usefixtures("loopback_ice")]
SDP = {"Content-Type": "application/sdp"}


async def call_offer(
    video_codec: str | None = None, audio: str = "sendrecv"
) -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction=audio)
    transceiver = pc.addTransceiver("video", direction="recvonly")
    if video_codec:
        codecs = RTCRtpReceiver.getCapabilities("video").codecs
        transceiver.setCodecPreferences([c for c in codecs if c.mimeType in (video_codec, "video/rtx")])
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def test_offers_above_the_cap_or_malformed_are_refused_naming_the_field(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings(max_output_size="1280x720", connect_timeout_s=5)))
    pc, sdp = await call_offer()
    for fields, named in (
        ({"size": "1920x1080"}, "'size' 1920x1080 is above this server's maximum output size 1280x720"),
        ({"size": "1280 by 720"}, "'size' must be WIDTHxHEIGHT"),
        ({"size": 1280}, "'size' must be a string"),
        ({"size": "1281x720"}, "width must be even"),
        ({"width": 640}, "'height' must be an integer"),
        ({"width": 640, "height": "tall"}, "'height' must be an integer"),
        ({"size": "640x360", "width": 640}, "not both"),
    ):
        response = await client.post("/offer", json={"sdp": sdp, "type": "offer", **fields})
        assert response.status == 400, fields
        assert named in (await response.json())["error"], fields
    whip = await client.post("/whip?size=4000x4000", data=sdp, headers=SDP)
    assert whip.status == 400 and "query 'size'" in (await whip.json())["error"]
    assert not client.app[RUNTIME].sessions.sessions  # nothing left behind
    await pc.close()


async def test_the_codec_follows_the_offer_and_the_servers_preference(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings(max_sessions=3, connect_timeout_s=5)))
    pcs = []
    for codec, expected in ((None, "vp8"), ("video/H264", "h264"), ("video/VP8", "vp8")):
        pc, sdp = await call_offer(codec)
        pcs.append(pc)
        response = await client.post("/offer", json={"sdp": sdp, "type": "offer", "size": "1280x720"})
        assert response.status == 200, await response.text()
        answer = await response.json()
        assert (answer["codec"], answer["size"]) == (expected, "1280x720")
        video = answer["sdp"].split("m=video", 1)[1]
        assert ("H264/90000" in video) == (expected == "h264") and ("VP8/90000" in video) == (
            expected == "vp8"
        )
    for pc in pcs:
        await pc.close()
    await client.app[RUNTIME].sessions.close_all()

    only_vp8 = await aiohttp_client(create_app(Settings(video_codecs="vp8", connect_timeout_s=5)))
    pc, sdp = await call_offer("video/H264")
    refused = await only_vp8.post("/offer", json={"sdp": sdp, "type": "offer"})
    assert refused.status == 400
    assert "video codecs (h264, rtx) include none of this server's (vp8)" in (await refused.json())["error"]
    assert not only_vp8.app[RUNTIME].sessions.sessions
    await pc.close()


async def test_viewers_share_one_encoder_per_size_and_codec(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings(max_viewers=4, connect_timeout_s=5)))
    pc, sdp = await call_offer(audio="sendonly")
    created = await client.post("/whip?size=1280x720", data=sdp, headers=SDP)
    assert created.status == 201
    session_id = created.headers["Location"].rsplit("/", 1)[-1]
    session = client.app[RUNTIME].sessions.get(session_id)
    assert session.size == OutputSize(1280, 720)
    viewers = []
    for query, codec in (
        ("", None),
        ("?size=640x360", "video/VP8"),
        ("?size=640x360", None),
        ("", "video/H264"),
    ):
        viewer_pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        transceiver = viewer_pc.addTransceiver("video", direction="recvonly")
        if codec:
            caps = RTCRtpReceiver.getCapabilities("video").codecs
            transceiver.setCodecPreferences([c for c in caps if c.mimeType in (codec, "video/rtx")])
        await viewer_pc.setLocalDescription(await viewer_pc.createOffer())
        response = await client.post(
            f"/whep/{session_id}{query}", data=viewer_pc.localDescription.sdp, headers=SDP
        )
        assert response.status == 201, await response.text()
        viewers.append(viewer_pc)
    keys = {(str(size), codec): f.subscribers for (size, codec), f in session.viewers.fanouts.items()}
    assert keys == {("1280x720", "vp8"): 1, ("640x360", "vp8"): 2, ("1280x720", "h264"): 1}
    for viewer_pc in viewers:
        await viewer_pc.close()
    await session.close("test over")
    assert not session.viewers.fanouts
    await pc.close()


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["h264", "vp8"])
async def test_a_call_receives_1280x720_frames_in_the_codec_it_offered(aiohttp_client, codec: str) -> None:
    """The 320 px avatar scaled into 1280x720 (letterboxed), decoded by aiortc's receiver; the mouth moves."""
    client = await aiohttp_client(create_app(Settings()))
    sent = to_int16(speech_pattern([("silence", 0.8), ("speech", 1.2), ("silence", 0.6)]))
    options = CallOptions(size="1280x720", codec=codec)
    recording = await call(str(client.make_url("")).rstrip("/"), sent, http=client.session, options=options)
    assert recording.video.size == (1280, 720)
    assert len(recording.video.regions) >= 40
    regions = np.asarray(recording.video.regions, dtype=np.float64)
    motion = np.abs(regions - regions[:5].mean(axis=0)).mean(axis=(1, 2, 3))
    assert motion.max() > 4.0, motion.round(1).tolist()
    black = recording.video.first_frame
    assert black is not None and black[:, :200].max() < 30  # the letterbox bars: black


@pytest.mark.slow
async def test_a_whep_viewer_gets_h264_at_its_own_size(aiohttp_client) -> None:
    """A WHIP session at the avatar's size, watched over WHEP in H.264 at 640x360 (its own encoder)."""
    from lipcast.probe.wish import open_publisher, open_viewer

    client = await aiohttp_client(create_app(Settings()))
    url = str(client.make_url("")).rstrip("/")
    sent = to_int16(speech_pattern([("silence", 0.5), ("speech", 1.5), ("silence", 0.5)]))
    publisher = await open_publisher(client.session, url, sent, receive=False)
    try:
        await publisher.wait_connected(10)
        assert publisher.session_id is not None
        viewer = await open_viewer(client.session, url, publisher.session_id, size="640x360", codec="h264")
        try:
            await viewer.wait_connected(10)
            assert publisher.source is not None
            await publisher.source.done.wait()
            session = client.app[RUNTIME].sessions.get(publisher.session_id)
            assert [(str(s), c) for s, c in session.viewers.fanouts] == [("640x360", "h264")]
        finally:
            await viewer.close()
    finally:
        await publisher.close()
    assert viewer.video.size == (640, 360) and len(viewer.video.arrived_at) >= 30
