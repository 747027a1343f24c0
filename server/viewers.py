"""WHEP viewers: receive-only peer connections that watch a live session's avatar and voice.

A session owns one :class:`SessionViewers`. Its viewers share one :class:`EncodedFanout` (one VP8 and one
Opus encode per tick for all of them), started with the first viewer and stopped after the last. A
:class:`Viewer` owns its peer connection and its subscription; ``close()`` releases both and is idempotent.
It runs on DELETE, when the connection fails or closes, when it never comes up, and when the session ends.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.rtcconfiguration import RTCConfiguration

from lipcast.server.capacity import CapacityGate
from lipcast.server.errors import BadRequestError, NotFoundError
from lipcast.server.offer_checks import check_viewer_offer, validate_offer
from lipcast.server.peer import PeerEndpoint
from lipcast.streaming.avatar_stream import AvatarStream
from lipcast.streaming.encoders import Vp8Settings
from lipcast.streaming.fanout import EncodedFanout, Subscription, route_keyframe_requests
from lipcast.streaming.interop import answer_dtls_as_server
from lipcast.streaming.offers import OfferSummary
from lipcast.streaming.wire import FrameMeta

logger = logging.getLogger(__name__)

# The shared encoders make VP8 and Opus; a viewer must accept them (RTX for VP8 retransmissions).
VIEWER_CODECS = {"video": ("video/vp8", "video/rtx"), "audio": ("audio/opus",)}


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
    ) -> None:
        self.session_id = session_id
        self.stream = stream
        self.rtc_configuration = rtc_configuration
        self.max_viewers = max_viewers
        self.video_bitrate_bps = video_bitrate_bps
        self.vp8 = vp8
        self.connect_timeout_s = connect_timeout_s
        self.viewers: dict[str, Viewer] = {}
        self.fanout: EncodedFanout | None = None
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
            out["encoder"] = vars(self.fanout.stats)
        return out

    async def add(self, offer_sdp: str) -> ViewerAnswer:
        """Answer a WHEP offer with a new viewer, or raise an :class:`ApiError` leaving nothing behind."""
        if self._closed:
            raise NotFoundError(f"session {self.session_id!r} has ended")
        summary = validate_offer(offer_sdp)
        check_viewer_offer(summary)
        with self.gate.hold():  # the slot is held across the negotiation
            pc = RTCPeerConnection(self.rtc_configuration())
            viewer = Viewer(secrets.token_urlsafe(9), pc, self)
            try:
                await self._negotiate(viewer, summary, offer_sdp)
            except BaseException:
                await viewer.close("negotiation failed")
                raise
            self.viewers[viewer.id] = viewer
        self.total += 1
        viewer.arm_connect_timeout(self.connect_timeout_s)
        viewer.log.info("viewer created (%d watching)", len(self.viewers))
        return ViewerAnswer(viewer.id, pc.localDescription.sdp)

    async def _negotiate(self, viewer: Viewer, summary: OfferSummary, offer_sdp: str) -> None:
        pc = viewer.pc
        if self.fanout is None:
            self.fanout = EncodedFanout(self.stream, video_bitrate_bps=self.video_bitrate_bps, vp8=self.vp8)
            self.fanout.on_failure = self._fanout_failed
        fanout = self.fanout
        subscription = fanout.subscribe(viewer.send_meta)
        viewer.subscription = subscription
        # Transceivers made before the offer is applied take its sections (one per kind), so their codec
        # preferences decide the answer: only what the shared encoders produce.
        for kind, track in (("audio", subscription.audio), ("video", subscription.video)):
            if not summary.of_kind(kind):
                continue
            transceiver = pc.addTransceiver(track, direction="sendonly")
            wanted = VIEWER_CODECS[kind]
            codecs = [c for c in RTCRtpSender.getCapabilities(kind).codecs if c.mimeType.lower() in wanted]
            transceiver.setCodecPreferences(codecs)
            route_keyframe_requests(transceiver.sender, fanout.request_keyframe)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as e:  # aiortc raises ValueError, OperationError, ... for what it cannot accept
            detail = str(e) or type(e).__name__
            raise BadRequestError(
                f"cannot answer the offer ({detail}); a viewer must accept VP8 video and Opus audio"
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
        fanout = self.fanout
        if fanout is not None and viewer.subscription is not None:
            fanout.unsubscribe(viewer.subscription)
            viewer.subscription = None
            if fanout.subscribers == 0 and self.fanout is fanout:
                # Nobody watches: stop encoding. The next viewer starts a fresh encoder (with a keyframe).
                self.fanout = None
                await fanout.stop()

    async def close(self, reason: str = "session closed") -> None:
        self._closed = True
        await asyncio.gather(*(v.close(reason) for v in list(self.viewers.values())))
        if self.fanout is not None:
            fanout, self.fanout = self.fanout, None
            await fanout.stop()
