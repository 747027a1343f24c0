"""WHEP viewers: receive-only peer connections that watch a live session's avatar and voice.

A session owns one :class:`SessionViewers`. Its viewers share one :class:`EncodedFanout` per (output size,
video codec) (one video and one Opus encode per tick for all viewers of that pair), started with its first
viewer and stopped after its last. A viewer's size is its query's (``?size=1280x720``) or the session's; its
codec the first of the server's preference that its offer lists. A
:class:`Viewer` owns its peer connection and its subscription; ``close()`` releases both and is idempotent.
It runs on DELETE, when the connection fails or closes, when it never comes up, and when the session ends.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.rtcconfiguration import RTCConfiguration

from lipcast.server.capacity import CapacityGate
from lipcast.server.errors import BadRequestError, NotFoundError
from lipcast.server.offer_checks import check_video_codec, check_viewer_offer, validate_offer
from lipcast.server.peer import PeerEndpoint
from lipcast.streaming.avatar_stream import AvatarStream
from lipcast.streaming.codecs import codec_preferences
from lipcast.streaming.encoders import VIDEO_CODECS, H264Settings, Vp8Settings
from lipcast.streaming.fanout import EncodedFanout, Subscription, route_keyframe_requests, scaled_bitrate_bps
from lipcast.streaming.interop import answer_dtls_as_server
from lipcast.streaming.offers import OfferSummary
from lipcast.streaming.rtc import video_estimate_bps
from lipcast.streaming.sizes import OutputSize
from lipcast.streaming.wire import FrameMeta

logger = logging.getLogger(__name__)

# The shared encoders make VP8 or H.264 (streaming/codecs.py) and Opus; a viewer must accept one of them.
AUDIO_CODECS = ("audio/opus",)
FanoutKey = tuple[OutputSize, str]


@dataclass(frozen=True)
class ViewerAnswer:
    viewer_id: str
    sdp: str


class Viewer(PeerEndpoint):
    def __init__(self, viewer_id: str, pc: RTCPeerConnection, group: SessionViewers) -> None:
        super().__init__(pc, f"{group.session_id}/{viewer_id}")
        self.id = viewer_id
        self.group = group
        self.subscription: Subscription | None = None
        self.key: FanoutKey | None = None  # the shared encoder it watches

    def send_meta(self, meta: FrameMeta | None) -> None:
        """The metadata of each video frame this viewer is sent (None: a frame without metadata)."""
        if meta is not None:
            super().send_meta(meta)

    async def forget(self) -> None:
        await self.group.forget(self)


class SessionViewers:
    """The viewers of one session and the shared encoders that feed them."""

    def __init__(
        self,
        session_id: str,
        stream: AvatarStream,
        rtc_configuration: Callable[[], RTCConfiguration],
        *,
        max_viewers: int,
        video_bitrate_bps: int,
        connect_timeout_s: float,
        vp8: Vp8Settings | None = None,
        h264: H264Settings | None = None,
        codecs: tuple[str, ...] = VIDEO_CODECS,
        default_size: OutputSize | None = None,
    ) -> None:
        self.session_id = session_id
        self.stream = stream
        self.rtc_configuration = rtc_configuration
        self.max_viewers = max_viewers
        self.video_bitrate_bps = video_bitrate_bps
        self.vp8 = vp8
        self.h264 = h264
        self.codecs = codecs
        self.default_size = default_size or OutputSize(stream.avatar.width, stream.avatar.height)
        self.connect_timeout_s = connect_timeout_s
        self.viewers: dict[str, Viewer] = {}
        self.fanouts: dict[FanoutKey, EncodedFanout] = {}
        self.total = 0  # viewers ever admitted
        self.gate = CapacityGate(
            max_viewers,
            lambda: len(self.viewers),
            lambda limit: f"session {session_id!r} has its {limit} viewers; try again later",
        )
        self._closed = False

    def __len__(self) -> int:
        return len(self.gate)

    def get(self, viewer_id: str) -> Viewer:
        viewer = self.viewers.get(viewer_id)
        if viewer is None:
            raise NotFoundError(f"no viewer {viewer_id!r} of session {self.session_id!r}")
        return viewer

    def stats_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": len(self.viewers), "total": self.total}
        if self.fanout is not None:
            out["encoder"] = vars(self.fanout.stats)  # the session's size in the first codec, or any
        if self.fanouts:
            out["encoders"] = [
                {"size": str(size), "codec": codec, "viewers": f.subscribers, **vars(f.stats)}
                for (size, codec), f in self.fanouts.items()
            ]
        return out

    @property
    def fanout(self) -> EncodedFanout | None:
        """The shared encoder at the session's size in its first codec (where most viewers are), else any."""
        return self.fanouts.get((self.default_size, self.codecs[0])) or next(
            iter(self.fanouts.values()), None
        )

    async def add(self, offer_sdp: str, size: OutputSize | None = None) -> ViewerAnswer:
        """Answer a WHEP offer with a new viewer, or raise an :class:`ApiError` leaving nothing behind.
        ``size``: the viewer's video size, checked against the cap already (None: the session's)."""
        if self._closed:
            raise NotFoundError(f"session {self.session_id!r} has ended")
        summary = validate_offer(offer_sdp)
        check_viewer_offer(summary)
        codec = check_video_codec(summary, self.codecs) or self.codecs[0]
        key = (size or self.default_size, codec)
        with self.gate.hold():  # the slot is held across the negotiation
            pc = RTCPeerConnection(self.rtc_configuration())
            viewer = Viewer(secrets.token_urlsafe(9), pc, self)
            try:
                await self._negotiate(viewer, summary, offer_sdp, key)
            except BaseException:
                await viewer.close("negotiation failed")
                raise
            self.viewers[viewer.id] = viewer
        self.total += 1
        viewer.arm_connect_timeout(self.connect_timeout_s)
        viewer.log.info("viewer created (%d watching)", len(self.viewers))
        return ViewerAnswer(viewer.id, pc.localDescription.sdp)

    async def _negotiate(self, viewer: Viewer, summary: OfferSummary, offer_sdp: str, key: FanoutKey) -> None:
        pc = viewer.pc
        fanout = self.fanouts.get(key)
        if fanout is None:
            size, codec = key
            fanout = self.fanouts[key] = EncodedFanout(
                self.stream,
                video_bitrate_bps=scaled_bitrate_bps(self.video_bitrate_bps, size),
                vp8=self.vp8,
                h264=self.h264,
                size=size,
                codec=codec,
            )
            fanout.on_failure = self._fanout_failed
            self.stream.frames.idle.prefetch(self.stream.avatar, size)
        subscription = fanout.subscribe(viewer.send_meta)
        viewer.subscription = subscription
        viewer.key = key
        # Transceivers made before the offer is applied take its sections (one per kind), so their codec
        # preferences decide the answer: only what the shared encoders produce.
        for kind, track in (("audio", subscription.audio), ("video", subscription.video)):
            if not summary.of_kind(kind):
                continue
            transceiver = pc.addTransceiver(track, direction="sendonly")
            if kind == "video":
                codecs = codec_preferences(key[1])
            else:
                codecs = [
                    c for c in RTCRtpSender.getCapabilities(kind).codecs if c.mimeType.lower() in AUDIO_CODECS
                ]
            transceiver.setCodecPreferences(codecs)
            route_keyframe_requests(transceiver.sender, fanout.request_keyframe)
            if kind == "video":
                subscription.estimate_bps = functools.partial(video_estimate_bps, transceiver.sender)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as e:  # aiortc raises ValueError, OperationError, ... for what it cannot accept
            detail = str(e) or type(e).__name__
            raise BadRequestError(
                f"cannot answer the offer ({detail}); "
                f"a viewer must accept {key[1].upper()} video and Opus audio"
            ) from e
        answer_dtls_as_server(pc)
        await pc.setLocalDescription(await pc.createAnswer())
        if self._closed:  # the session ended while this viewer was negotiating (its encoder is stopped)
            raise NotFoundError(f"session {self.session_id!r} has ended")
        fanout.start()

    def _fanout_failed(self, error: Exception) -> None:
        """The shared encoders failed (they logged why) and ended their tracks: the viewers' calls end."""
        for viewer in list(self.viewers.values()):
            viewer.schedule_close(f"viewer encoder failed ({type(error).__name__})")

    async def forget(self, viewer: Viewer) -> None:
        self.viewers.pop(viewer.id, None)
        await self._release(viewer)

    async def _release(self, viewer: Viewer) -> None:
        key = viewer.key
        fanout = self.fanouts.get(key) if key is not None else None
        if key is not None and fanout is not None and viewer.subscription is not None:
            fanout.unsubscribe(viewer.subscription)
            viewer.subscription = None
            if fanout.subscribers == 0 and self.fanouts.get(key) is fanout:
                # Nobody watches: stop encoding. The next viewer starts a fresh encoder (with a keyframe).
                del self.fanouts[key]
                await fanout.stop()

    async def close(self, reason: str = "session closed") -> None:
        self._closed = True
        await asyncio.gather(*(v.close(reason) for v in list(self.viewers.values())))
        fanouts, self.fanouts = list(self.fanouts.values()), {}
        for fanout in fanouts:
            await fanout.stop()
