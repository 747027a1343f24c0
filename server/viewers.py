"""WHEP viewers: receive-only peer connections that watch a live session's avatar and voice.

A session owns one :class:`SessionViewers`. Its viewers share one :class:`EncodedFanout` (one VP8 and one
Opus encode per tick for all of them), started with the first viewer and stopped after the last. A
:class:`Viewer` owns its peer connection and its subscription; ``close()`` releases both and is idempotent.
It runs on DELETE, when the connection fails or closes, when it never comes up, and when the session ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.rtcconfiguration import RTCConfiguration
from aiortc.rtcdatachannel import RTCDataChannel

from server.errors import BadRequestError, CapacityError, NotFoundError
from streaming.avatar_stream import AvatarStream, FrameMeta
from streaming.fanout import EncodedFanout, Subscription, route_keyframe_requests
from streaming.offers import OfferError, OfferSummary, summarize_offer

logger = logging.getLogger(__name__)

META_CHANNEL_LABEL = "meta"
META_BACKLOG = 250  # frames of metadata kept until the channel opens (10 s at 25 fps), as for the caller
RETRY_AFTER_S = 10
# The shared encoders make VP8 and Opus; a viewer must accept them (RTX for VP8 retransmissions).
VIEWER_CODECS = {"video": ("video/vp8", "video/rtx"), "audio": ("audio/opus",)}


@dataclass(frozen=True)
class ViewerAnswer:
    viewer_id: str
    sdp: str


def check_viewer_offer(summary: OfferSummary) -> None:
    """WHEP: audio and/or video, at most one of each, each receiving (recvonly or sendrecv)."""
    media = [m for m in summary.media if m.kind in ("audio", "video")]
    if not media:
        raise BadRequestError("the offer has no audio or video section to receive the avatar on")
    for kind in ("audio", "video"):
        if len(summary.of_kind(kind)) > 1:
            raise BadRequestError(f"the offer has more than one {kind} section; WHEP sends one stream")
    for m in media:
        if not m.offerer_receives:
            raise BadRequestError(
                f"the offer's {m.kind} section must be recvonly (or sendrecv), not {m.direction}"
            )


class Viewer:
    def __init__(self, viewer_id: str, pc: RTCPeerConnection, group: SessionViewers) -> None:
        self.id = viewer_id
        self.pc = pc
        self.group = group
        self.subscription: Subscription | None = None
        self.meta_channel: RTCDataChannel | None = None
        self._meta_backlog: deque[str] = deque(maxlen=META_BACKLOG)
        self.closed = asyncio.Event()
        self._closing = False
        self._connect_timer: asyncio.TimerHandle | None = None
        self._close_task: asyncio.Task[None] | None = None

    @property
    def tag(self) -> str:
        return f"{self.group.session_id}/{self.id}"

    def on_connection_state(self) -> None:
        state = self.pc.connectionState
        logger.info("[%s] viewer connection %s", self.tag, state)
        if state == "connected":
            if self._connect_timer is not None:
                self._connect_timer.cancel()
                self._connect_timer = None
        elif state in ("failed", "closed"):
            self.schedule_close(f"connection {state}")

    def on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label == META_CHANNEL_LABEL:
            self.meta_channel = channel

    def send_meta(self, meta: FrameMeta | None) -> None:
        """The metadata of each video frame this viewer is sent; kept until its channel (if any) opens."""
        if meta is None:
            return
        message = json.dumps(meta.to_json(), separators=(",", ":"))
        channel = self.meta_channel
        if channel is None or channel.readyState != "open":
            self._meta_backlog.append(message)
            return
        while self._meta_backlog:
            channel.send(self._meta_backlog.popleft())
        channel.send(message)

    def arm_connect_timeout(self, timeout_s: float) -> None:
        self._connect_timer = asyncio.get_running_loop().call_later(
            timeout_s, self.schedule_close, f"not connected within {timeout_s:g} s"
        )

    def schedule_close(self, reason: str) -> None:
        if self._close_task is None and not self._closing:
            self._close_task = asyncio.create_task(self.close(reason), name=f"close-viewer-{self.id}")

    async def close(self, reason: str = "closed") -> None:
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        logger.info("[%s] viewer closing: %s", self.tag, reason)
        if self._connect_timer is not None:
            self._connect_timer.cancel()
            self._connect_timer = None
        try:
            await self.pc.close()
        finally:
            await self.group.forget(self)
            self.closed.set()


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
    ) -> None:
        self.session_id = session_id
        self.stream = stream
        self.rtc_configuration = rtc_configuration
        self.max_viewers = max_viewers
        self.video_bitrate_bps = video_bitrate_bps
        self.connect_timeout_s = connect_timeout_s
        self.viewers: dict[str, Viewer] = {}
        self.fanout: EncodedFanout | None = None
        self.total = 0  # viewers ever admitted
        self._reserved = 0
        self._closed = False

    def __len__(self) -> int:
        return len(self.viewers) + self._reserved

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
        try:
            summary = summarize_offer(offer_sdp)
        except OfferError as e:
            raise BadRequestError(f"malformed SDP offer: {e}") from e
        check_viewer_offer(summary)
        if len(self) >= self.max_viewers:
            raise CapacityError(
                f"session {self.session_id!r} has its {self.max_viewers} viewers; try again later",
                RETRY_AFTER_S,
            )
        self._reserved += 1
        pc = RTCPeerConnection(self.rtc_configuration())
        viewer = Viewer(secrets.token_urlsafe(9), pc, self)
        try:
            await self._negotiate(viewer, summary, offer_sdp)
        except BaseException:
            await viewer.close("negotiation failed")
            raise
        finally:
            self._reserved -= 1
        self.viewers[viewer.id] = viewer
        self.total += 1
        viewer.arm_connect_timeout(self.connect_timeout_s)
        logger.info("[%s] viewer created (%d watching)", viewer.tag, len(self.viewers))
        return ViewerAnswer(viewer.id, pc.localDescription.sdp)

    async def _negotiate(self, viewer: Viewer, summary: OfferSummary, offer_sdp: str) -> None:
        pc = viewer.pc
        pc.on("connectionstatechange", viewer.on_connection_state)
        pc.on("datachannel", viewer.on_datachannel)
        if self.fanout is None:
            self.fanout = EncodedFanout(self.stream, video_bitrate_bps=self.video_bitrate_bps)
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
        await pc.setLocalDescription(await pc.createAnswer())
        if self._closed:  # the session ended while this viewer was negotiating (its encoder is stopped)
            raise NotFoundError(f"session {self.session_id!r} has ended")
        fanout.start()

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
