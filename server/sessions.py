"""Sessions: one caller, one peer connection, and everything that serves it.

A :class:`Session` owns its ``RTCPeerConnection``, the inbound ingest task, the media-clock producer, the two
outgoing tracks, the metadata channel and the engine's queued frames. ``close()`` releases all of it and is
idempotent; it runs when the connection fails or closes, when the client deletes the session, when a
connection never comes up, and at server shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import LipSyncBackend
from lipcast.pipeline.enhance.options import (
    EnhanceChoice,
    EnhanceOptionError,
    EnhancePolicy,
    EnhanceRefusedError,
    sharpen_device,
)
from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ
from lipcast.server.capacity import RETRY_AFTER_S, CapacityGate
from lipcast.server.config import Settings
from lipcast.server.errors import BadRequestError, CapacityError, ConflictError, NotFoundError
from lipcast.server.offer_checks import (
    check_call_offer,
    check_video_codec,
    check_whip_offer,
    validate_offer,
)
from lipcast.server.peer import PeerEndpoint
from lipcast.server.viewers import SessionViewers
from lipcast.streaming.audio_buffer import InputAudioBuffer, make_input_buffer
from lipcast.streaming.avatar_stream import AvatarStream, Renderer
from lipcast.streaming.clock import Clock, MonotonicClock
from lipcast.streaming.codecs import send_only_codec
from lipcast.streaming.inbound import AudioIngest
from lipcast.streaming.interop import answer_dtls_as_server
from lipcast.streaming.offers import OfferSummary
from lipcast.streaming.rtc import discard_received_media, encode_audio_on_loop, tune_receiver_latency
from lipcast.streaming.sizes import OutputSize, fitted
from lipcast.streaming.tracks import AvatarAudioTrack, AvatarVideoTrack
from lipcast.streaming.vad import SpeechDetector
from lipcast.streaming.wire import FrameMeta

logger = logging.getLogger(__name__)

# The inbound packet stage's counters in counters() (lipcast.streaming.playout)
PLAYOUT_COUNTERS = (
    "audio_packets_lost",
    "audio_concealed_samples",
    "audio_fec_recovered",
    "audio_fec_missed",
    "audio_packets_late",
    "audio_packets_reordered",
    "audio_stretched_samples",
)

SIGNALLING = ("offer", "whip")  # the call page's JSON /offer, or WHIP (RFC 9725) ingest
# (push sessions, server/push.py, have signalling "push" and no negotiated peer connection)


@dataclass(frozen=True)
class Answer:
    session_id: str
    sdp: str
    type: str
    avatar: Avatar


class Session(PeerEndpoint):
    def __init__(
        self,
        session_id: str,
        pc: RTCPeerConnection,
        avatar: Avatar,
        stream: AvatarStream,
        buffer: InputAudioBuffer,
        detector: SpeechDetector,
        manager: SessionManager,
        signalling: str = "offer",
        size: OutputSize | None = None,
    ) -> None:
        """``size``: the video's output size (None: the avatar's own, fitted into the server's cap)."""
        super().__init__(pc, session_id)
        self.id = session_id
        self.signalling = signalling
        cap = manager.settings.output_cap()
        self.size = size or fitted(avatar.width, avatar.height, cap)
        self.codec: str | None = None  # the video codec sent, once negotiated
        stream.frames.idle.prefetch(avatar, self.size)  # the idle frames at this size, off the event loop
        self.avatar = avatar
        self.stream = stream
        self.buffer = buffer
        self.detector = detector
        self.manager = manager
        self.video = AvatarVideoTrack(stream, on_frame=self._frame_sent, size=self.size)
        self.audio = AvatarAudioTrack(stream)
        self.viewers = SessionViewers(
            session_id,
            stream,
            manager.rtc_configuration,
            max_viewers=manager.settings.max_viewers,
            video_bitrate_bps=manager.settings.viewer_bitrate_kbps * 1000,
            connect_timeout_s=manager.settings.connect_timeout_s,
            vp8=manager.settings.vp8(),
            h264=manager.settings.h264(),
            codecs=manager.settings.codec_preference(),
            default_size=self.size,
        )
        self.ingest: AudioIngest | None = None
        stream.on_failure = self._stage_failed
        pc.on("track", self.on_track)

    def counters(self) -> dict[str, int]:
        """This session's running totals (summed over sessions by the metrics)."""
        stream, video, buffer = self.stream.stats, self.video.stats, self.buffer.stats
        return {
            "frames_in": self.ingest.frames_received if self.ingest is not None else 0,
            "frames_out": video.sent,
            "frames_rendered": stream.rendered,
            "frames_at_rest": stream.at_rest,
            "frames_late": video.late,
            "frames_skipped": video.skipped,
            "frames_failed": video.failed,
            "audio_underruns": buffer.underruns,
            "audio_trimmed_samples": buffer.trimmed_samples,
            "audio_overflow_samples": buffer.overflow_samples,
            **self._playout_counters(),
        }

    def _playout_counters(self) -> dict[str, int]:
        playout = self.ingest.playout if self.ingest is not None else None
        if playout is None:
            return dict.fromkeys(PLAYOUT_COUNTERS, 0)
        stats = playout.stats
        return {
            "audio_packets_lost": stats.lost,
            "audio_concealed_samples": stats.concealed_samples,
            "audio_fec_recovered": stats.fec_recovered,
            "audio_fec_missed": stats.fec_missed,
            "audio_packets_late": stats.late,
            "audio_packets_reordered": stats.reordered,
            "audio_stretched_samples": stats.stretched_samples,
        }

    def on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self.ingest is not None or self.closing:
            return
        self.ingest = AudioIngest(
            track, self.buffer, self.detector, session_id=self.id, on_failure=self._stage_failed
        )
        self.ingest.start()

    def _stage_failed(self, error: Exception) -> None:
        """A stage of this call failed (it logged why): the call ends, as when the connection drops."""
        self.schedule_close(f"media failed ({type(error).__name__})")

    def on_connected(self) -> None:
        self.stream.start()

    def arm_timers(self, connect_timeout_s: float, max_session_s: float | None) -> None:
        """Close if the connection does not come up in time, and when the session's time is up."""
        self.arm_connect_timeout(connect_timeout_s)
        if max_session_s:
            self.close_after("limit", max_session_s, f"session time limit of {max_session_s:g} s reached")

    def _frame_sent(self, meta: FrameMeta) -> None:
        if self.ingest is not None:
            meta.rx = self.ingest.receive_counters()
        if self.manager.frame_observer is not None:
            self.manager.frame_observer(meta, self.buffer.depth_ms)
        self.send_meta(meta)

    async def release(self) -> None:
        """Stop everything this session started; a step that fails is logged and the others still run."""
        for what, step in (
            ("viewers", self._close_viewers),
            ("outgoing media", self._stop_media),
            ("inbound audio", self._stop_ingest),
        ):
            try:
                await step()
            except Exception:
                self.log.exception("stopping the %s failed", what)

    async def _close_viewers(self) -> None:
        await self.viewers.close("session closed")

    async def _stop_media(self) -> None:
        self.video.stop()
        self.audio.stop()
        await self.stream.stop()

    async def _stop_ingest(self) -> None:
        if self.ingest is not None:
            await self.ingest.stop()

    async def forget(self) -> None:
        self.manager.forget(self)


class SessionManager:
    """Creates sessions within the capacity limit and finds, lists and closes them."""

    def __init__(
        self,
        settings: Settings,
        backend: LipSyncBackend,
        renderer: Renderer,
        avatars: Mapping[str, Avatar],
        clock: Clock | None = None,
    ) -> None:
        if settings.render_budget_ms is None:
            # One place decides the default (it depends on the device): build_runtime, before this.
            raise ValueError(
                "render_budget_ms is resolved at startup (lipcast.server.assembly.build_runtime)"
            )
        self.render_budget_ms = settings.render_budget_ms
        self.settings = settings
        self.backend = backend
        self.enhance = EnhancePolicy(
            settings.enhance_default(), sharpen_device(backend), settings.face_enhance_allow_cpu
        )
        self.renderer = renderer
        self.avatars = avatars
        self.clock = clock or MonotonicClock()
        self.sessions: dict[str, Session] = {}
        self.gate = CapacityGate(
            settings.max_sessions,
            lambda: len(self.sessions),
            lambda limit: f"all {limit} sessions are in use; try again later",
        )
        self._closed_totals: Counter[str] = Counter()  # counters of sessions that have ended
        self.created_total = 0
        self.refused_total: Counter[str] = Counter()
        self.draining = False
        self.frame_observer: Callable[[FrameMeta, float], None] | None = None

    def __len__(self) -> int:
        return len(self.gate)

    def get(self, session_id: str) -> Session:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise NotFoundError(f"no session {session_id!r}") from None

    def forget(self, session: Session) -> None:
        if self.sessions.pop(session.id, None) is not None:
            self._closed_totals.update(session.counters())

    def totals(self) -> Counter[str]:
        """Every session counter summed over all sessions since start, live and ended."""
        totals = Counter(self._closed_totals)
        for session in self.sessions.values():
            totals.update(session.counters())
        return totals

    @property
    def frames_sent_total(self) -> int:
        """Video frames sent since start, by every session (live and ended)."""
        return self.totals()["frames_out"]

    async def drain(self, timeout_s: float) -> int:
        """Refuse new sessions, wait up to ``timeout_s`` for live ones to end, then close the rest.

        Returns how many had to be closed at the deadline.
        """
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.sessions and loop.time() < deadline:
            waits = [asyncio.ensure_future(s.closed.wait()) for s in self.sessions.values()]
            _, pending = await asyncio.wait(
                waits, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
        remaining = len(self.sessions)
        if remaining:
            logger.info("drain deadline reached: closing %d session(s)", remaining)
            await self.close_all("server shutdown (drain deadline)")
        return remaining

    def avatar(self, name: str | None) -> Avatar:
        name = name or self.settings.avatar
        avatar = self.avatars.get(name)
        if avatar is None:
            raise NotFoundError(f"unknown avatar {name!r}; available: {', '.join(sorted(self.avatars))}")
        return avatar

    def enhance_choice(self, mode: object | None = None, strength: object | None = None) -> EnhanceChoice:
        """A new session's face post-processing from its request (None: not given; the server default), or
        the refusal: 400 for a value that is not allowed, 409 for sharpen where this server cannot give it.
        Checked before anything of the call is started."""
        try:
            return self.enhance.resolve(mode, strength)
        except EnhanceOptionError as e:
            raise BadRequestError(str(e)) from None
        except EnhanceRefusedError as e:
            self.refused_total["face_enhance"] += 1
            raise ConflictError(str(e)) from None

    def admit(self, avatar_name: str | None) -> Avatar:
        """The avatar for a new session, or :class:`CapacityError` while draining or full."""
        if self.draining:
            self.refused_total["draining"] += 1
            raise CapacityError("the server is shutting down; try another instance", RETRY_AFTER_S)
        avatar = self.avatar(avatar_name)
        try:
            self.gate.check()
        except CapacityError:
            self.refused_total["capacity"] += 1
            raise
        return avatar  # the caller books its session before its next await (no slot held)

    def register(self, session: Session) -> None:
        """Book a session made outside :meth:`create` (a push session)."""
        self.sessions[session.id] = session
        self.created_total += 1

    def rtc_configuration(self) -> RTCConfiguration:
        return RTCConfiguration(
            iceServers=[
                RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
                for s in self.settings.ice_servers
            ]
        )

    async def create(
        self,
        offer: RTCSessionDescription,
        avatar_name: str | None,
        *,
        signalling: str = "offer",
        enhance: EnhanceChoice | None = None,
        size: OutputSize | None = None,
    ) -> Answer:
        """Answer an offer with a new session, or raise an :class:`ApiError` leaving nothing behind.

        ``signalling="offer"`` (the call page) needs the client to send audio and receive video; ``"whip"``
        needs only audio from the client and sends back only what its offer asks to receive.
        ``enhance``: from :meth:`enhance_choice` (None: the server's default). ``size``: the video's output
        size, already checked against the cap (None: the avatar's own, fitted into it).
        """
        if signalling not in SIGNALLING:
            raise ValueError(f"signalling must be one of {SIGNALLING}")
        enhance = enhance or self.enhance_choice()
        avatar = self.admit(avatar_name)
        summary = validate_offer(offer.sdp)  # after the 503s: a draining or full server takes no offer
        (check_whip_offer if signalling == "whip" else check_call_offer)(summary)
        codec = (
            check_video_codec(summary, self.settings.codec_preference())
            if summary.receives("video")
            else None
        )
        with self.gate.hold():  # the slot is held across the awaits below
            session: Session | None = None
            pc = RTCPeerConnection(self.rtc_configuration())
            try:
                session = self._new_session(pc, avatar, signalling, enhance.effective_strength, size)
                session.codec = codec
                await self._negotiate(session, offer, summary)
            except BaseException:
                if session is not None:
                    await session.close("negotiation failed")
                else:
                    await pc.close()
                raise
            self.sessions[session.id] = session
        self.created_total += 1
        session.arm_timers(self.settings.connect_timeout_s, self.settings.max_session_s)
        local = pc.localDescription
        session.log.info(
            "created (avatar %s, %s %s, face_enhance %s)",
            avatar.name,
            session.size,
            session.codec or "no video",
            enhance.mode,
        )
        return Answer(session.id, local.sdp, local.type, avatar)

    def new_stream(
        self, session_id: str, avatar: Avatar, buffer: InputAudioBuffer, enhance_strength: float = 0.0
    ) -> AvatarStream:
        settings = self.settings
        return AvatarStream(
            session_id,
            avatar,
            self.backend.new_featurizer(),
            self.renderer,
            buffer,
            self.clock,
            fps=settings.fps,
            render_budget_ms=self.render_budget_ms,
            crossfade_frames=self.backend.crossfade_frames,
            new_featurizer=self.backend.new_featurizer,
            enhance_strength=enhance_strength,
        )

    def _new_session(
        self,
        pc: RTCPeerConnection,
        avatar: Avatar,
        signalling: str,
        enhance_strength: float = 0.0,
        size: OutputSize | None = None,
    ) -> Session:
        settings = self.settings
        session_id = secrets.token_urlsafe(9)
        buffer = make_input_buffer(
            MEDIA_SAMPLE_RATE_HZ,
            settings.jitter_buffer_ms,
            frame_ms=1000.0 / settings.fps,
            clock=self.clock.now,
            session_id=session_id,
        )
        detector = SpeechDetector(MEDIA_SAMPLE_RATE_HZ, settings.vad_aggressiveness)
        stream = self.new_stream(session_id, avatar, buffer, enhance_strength)
        return Session(session_id, pc, avatar, stream, buffer, detector, self, signalling, size)

    async def _negotiate(self, session: Session, offer: RTCSessionDescription, summary: OfferSummary) -> None:
        pc = session.pc
        try:
            await pc.setRemoteDescription(offer)
        except Exception as e:  # aiortc's parser raises ValueError, AssertionError, KeyError, ...
            detail = str(e) or type(e).__name__
            raise BadRequestError(f"malformed SDP offer: {detail}") from e
        if session.signalling == "whip":
            outgoing = self._whip_outgoing(session, summary)
        else:
            outgoing = [session.audio, session.video]
        ingest = session.ingest
        for transceiver in pc.getTransceivers():
            receiver = transceiver.receiver
            if ingest is not None and receiver.track is ingest.track and ingest.attach(receiver):
                continue  # the caller's voice: packets to lipcast's playout (loss, jitter, concealment)
            tune_receiver_latency(receiver)
        for track in outgoing:
            encode_audio_on_loop(pc.addTrack(track))
        if session.codec is not None:
            for transceiver in pc.getTransceivers():
                if transceiver.kind == "video":
                    send_only_codec(transceiver, session.codec)
        if session.signalling == "whip":
            # WHIP clients such as OBS also send video; only the voice is used. Their video is taken
            # (recvonly, as WHIP servers answer a sendonly section) and dropped on arrival, never decoded
            # (aiortc would decode it into an unbounded queue); a client that also receives gets the
            # avatar instead (sendonly).
            for transceiver in pc.getTransceivers():
                if transceiver.kind == "video":
                    transceiver.direction = "sendonly" if session.video in outgoing else "recvonly"
                    discard_received_media(transceiver.receiver)
        answer_dtls_as_server(pc)
        answer = await pc.createAnswer()
        await pc.setLocalDescription(answer)

    @staticmethod
    def _whip_outgoing(session: Session, summary: OfferSummary) -> list[MediaStreamTrack]:
        """A WHIP client gets the avatar back only where its offer asks to receive.

        A plain WHIP client (sendonly audio, no video section) gets no tracks: its session still runs its
        media clock once connected, for WHEP viewers to watch.
        """
        outgoing: list[MediaStreamTrack] = []
        if summary.receives("audio"):
            outgoing.append(session.audio)
        if summary.receives("video"):
            outgoing.append(session.video)
        return outgoing

    async def close_all(self, reason: str = "server shutdown") -> None:
        await asyncio.gather(*(s.close(reason) for s in list(self.sessions.values())))
