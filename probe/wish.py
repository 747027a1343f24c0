"""aiortc WHIP and WHEP clients that record what they receive: for tests, the viewer benchmark and by hand.

``open_publisher`` starts a session (WHIP, or the call page's JSON ``/offer``) sending known audio;
``open_viewer`` watches one over WHEP. Both return a :class:`Peer` at once (the session id is known before
the audio is over) and record video (mouth region only), audio and the per-frame metadata channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from yarl import URL

from lipcast.pipeline.timing import VIDEO_PTS_PER_FRAME
from lipcast.probe.media import PatternAudioTrack, ReceivedAudio, ReceivedVideo, record_audio, record_video
from lipcast.streaming.codecs import codec_preferences
from lipcast.streaming.wire import META_CHANNEL_LABEL, SDP_CONTENT_TYPE, MetaMessage, parse_meta


class WishError(RuntimeError):
    """The server refused the request; carries the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass
class Peer:
    """One client connection and what it received."""

    pc: RTCPeerConnection
    http: aiohttp.ClientSession
    resource_url: str | None = None  # WHIP/WHEP: the Location; /offer: /sessions/{id}
    session_id: str | None = None
    token: str | None = None
    source: PatternAudioTrack | None = None
    video: ReceivedVideo = field(default_factory=ReceivedVideo)
    audio: ReceivedAudio = field(default_factory=ReceivedAudio)
    meta: list[tuple[float, MetaMessage]] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def frame_arrivals(self) -> dict[int, float]:
        """Tick index -> arrival time of every received video frame.

        The receiver's pts counts 90 kHz ticks from the first frame it decoded, and the metadata channel
        delivers the first frame's tick number first (the server keeps it until the channel opens).
        """
        if not self.meta or not self.video.pts:
            return {}
        first = int(self.meta[0][1]["frame"])
        return {
            first + pts // VIDEO_PTS_PER_FRAME: t
            for pts, t in zip(self.video.pts, self.video.arrived_at, strict=True)
        }

    def frame_regions(self) -> dict[int, npt.NDArray[np.uint8]]:
        if not self.meta or not self.video.pts:
            return {}
        first = int(self.meta[0][1]["frame"])
        return {
            first + pts // VIDEO_PTS_PER_FRAME: r
            for pts, r in zip(self.video.pts, self.video.regions, strict=True)
        }

    async def wait_connected(self, timeout_s: float = 15.0) -> None:
        await asyncio.wait_for(self.connected.wait(), timeout_s)

    async def close(self, *, delete: bool = True) -> None:
        if delete and self.resource_url is not None:
            with contextlib.suppress(aiohttp.ClientError):
                async with self.http.delete(self.resource_url, headers=auth_headers(self.token)):
                    pass
        await self.pc.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def post_json(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], token: str | None, expected_status: int
) -> dict[str, Any]:
    """POST ``body`` as JSON (with the bearer token): the JSON answer, or :class:`WishError` on another
    status."""
    async with http.post(url, json=body, headers=auth_headers(token)) as response:
        data = await response.json(content_type=None)
        if response.status != expected_status:
            raise WishError(response.status, str(data))
    return dict(data)


async def mouth_box(
    http: aiohttp.ClientSession, base_url: str, avatar: str | None
) -> tuple[int, int, int, int] | None:
    async with http.get(f"{base_url}/avatars") as response:
        data = await response.json()
    name = avatar or data["default"]
    for a in data["avatars"]:
        if a["name"] == name:
            x1, y1, x2, y2 = a["mouth_box"]
            return (x1, y1, x2, y2)
    return None


async def drain(track: MediaStreamTrack) -> None:
    """Receive and drop (a viewer that only needs to keep its receiver's queue empty)."""
    with contextlib.suppress(MediaStreamError):
        while True:
            await track.recv()


def _wire(peer: Peer, region: tuple[int, int, int, int] | None, record: bool) -> None:
    pc = peer.pc

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        if not record:
            peer.tasks.append(asyncio.create_task(drain(track)))
        elif track.kind == "video":
            peer.tasks.append(asyncio.create_task(record_video(track, peer.video, region)))
        else:
            peer.tasks.append(asyncio.create_task(record_audio(track, peer.audio)))

    @pc.on("connectionstatechange")
    def on_state() -> None:
        if pc.connectionState == "connected":
            peer.connected.set()

    channel = pc.createDataChannel(META_CHANNEL_LABEL)

    @channel.on("message")
    def on_message(message: str | bytes) -> None:
        if isinstance(message, str):
            peer.meta.append((time.monotonic(), parse_meta(message)))


async def _post_sdp(peer: Peer, url: str) -> str:
    await peer.pc.setLocalDescription(await peer.pc.createOffer())
    headers = {"Content-Type": SDP_CONTENT_TYPE, **auth_headers(peer.token)}
    async with peer.http.post(url, data=peer.pc.localDescription.sdp, headers=headers) as response:
        body = await response.text()
        if response.status != 201:
            raise WishError(response.status, body)
        location = response.headers["Location"]
    peer.resource_url = str(response.url.join(URL(location)))
    return body


async def open_publisher(
    http: aiohttp.ClientSession,
    base_url: str,
    audio: npt.NDArray[np.int16],
    *,
    signalling: str = "whip",
    receive: bool = True,
    avatar: str | None = None,
    token: str | None = None,
) -> Peer:
    """Start a session sending ``audio`` (48 kHz mono int16) in real time once connected.

    ``signalling="whip"``: RFC 9725 POST; ``receive`` adds recvonly video and makes audio sendrecv, so the
    publisher also gets the avatar back. ``"offer"``: the call page's JSON /offer (always receives).
    """
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    source = PatternAudioTrack(audio)
    peer = Peer(pc, http, token=token, source=source)
    try:
        region = await mouth_box(http, base_url, avatar)
        _wire(peer, region, record=True)
        if signalling == "whip" and not receive:
            pc.addTransceiver(source, direction="sendonly")
        else:
            pc.addTransceiver(source, direction="sendrecv")
            pc.addTransceiver("video", direction="recvonly")
        if signalling == "whip":
            url = f"{base_url}/whip" + (f"?avatar={avatar}" if avatar else "")
            answer_sdp = await _post_sdp(peer, url)
            assert peer.resource_url is not None
            peer.session_id = peer.resource_url.rstrip("/").rsplit("/", 1)[-1]
        else:
            await pc.setLocalDescription(await pc.createOffer())
            body: dict[str, Any] = {"sdp": pc.localDescription.sdp, "type": "offer"}
            if avatar:
                body["avatar"] = avatar
            data = await post_json(http, f"{base_url}/offer", body, token, 200)
            peer.session_id = data["session_id"]
            peer.resource_url = f"{base_url}/sessions/{peer.session_id}"
            answer_sdp = data["sdp"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer_sdp, type="answer"))
    except BaseException:
        await peer.close(delete=peer.resource_url is not None)
        raise
    return peer


async def open_viewer(
    http: aiohttp.ClientSession,
    base_url: str,
    session_id: str,
    *,
    token: str | None = None,
    record: bool = True,
    avatar: str | None = None,
    size: str | None = None,
    codec: str | None = None,
) -> Peer:
    """Watch ``session_id`` over WHEP (recvonly audio and video, plus the metadata channel); ``size``
    (WIDTHxHEIGHT) and ``codec`` (vp8 or h264, the only one offered) as a viewer may ask for them."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    peer = Peer(pc, http, token=token, session_id=session_id)
    try:
        region = await mouth_box(http, base_url, avatar) if record else None
        _wire(peer, region, record)
        pc.addTransceiver("audio", direction="recvonly")
        video = pc.addTransceiver("video", direction="recvonly")
        if codec is not None:
            video.setCodecPreferences(codec_preferences(codec))
        query = f"?size={size}" if size else ""
        answer_sdp = await _post_sdp(peer, f"{base_url}/whep/{session_id}{query}")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer_sdp, type="answer"))
    except BaseException:
        await peer.close(delete=peer.resource_url is not None)
        raise
    return peer
