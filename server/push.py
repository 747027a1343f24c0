"""Push sessions: a program (a voice agent's TTS) pushes the avatar's audio over a WebSocket.

| method and path                   | what                                                              |
|-----------------------------------|-------------------------------------------------------------------|
| ``POST /sessions``                | JSON ``{"avatar", "sample_rate_hz", "encoding", "channels"}``: 201 |
| ``GET /sessions/{id}/audio``      | the audio WebSocket (one at a time)                               |
| ``GET``/``DELETE /sessions/{id}`` | stats / end the session (as for calls)                            |

The session's media clock starts when it is created; viewers watch over WHEP (``/whep/{id}``) or the viewer
page. On the socket: binary messages are PCM16 little-endian mono at the session's rate (any length; an odd
trailing byte waits for the next message); text messages are JSON control messages ``{"type": "interrupt"}``
(barge-in: everything queued is dropped and the mouth rests from the next frame that leaves),
``{"type": "end_of_speech"}`` (flush the tail of an utterance) and ``{"type": "close"}`` (end the session).
The server answers with JSON: ``{"type": "error", "code": ..., "message": ...}`` for input it refuses (the
session stays usable), ``{"type": "interrupted", "frame": N}`` (N: the first frame guaranteed at rest),
``{"type": "flushed", "queued_s": ...}``.

Audio pushed faster than real time is queued, up to ``push_buffer_s`` seconds, and played at real time. A
message that would overflow the queue is refused whole with ``code: "buffer_full"``; nothing is dropped
silently. The session ends on ``close``, DELETE, ``push_grace_s`` without a socket, or the time limit.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from aiohttp import WSMsgType, web
from aiortc import RTCPeerConnection

from lipcast.pipeline.enhance.options import MODE_FIELD, STRENGTH_FIELD, EnhanceChoice
from lipcast.pipeline.timing import FRAME_MS, MEDIA_SAMPLE_RATE_HZ
from lipcast.server.auth import require_bearer
from lipcast.server.errors import BadRequestError, ConflictError, NotFoundError
from lipcast.server.json_body import read_json_object
from lipcast.server.sessions import Session, SessionManager
from lipcast.server.state import runtime_of
from lipcast.streaming.audio_buffer import InputAudioBuffer
from lipcast.streaming.push_audio import (
    MAX_INPUT_RATE_HZ,
    MIN_INPUT_RATE_HZ,
    PushAudio,
    PushBufferFull,
)
from lipcast.streaming.vad import SpeechDetector
from lipcast.streaming.wire import PUSH_CONTROLS, PushSessionInfo

logger = logging.getLogger(__name__)

PUSH_START_MS = FRAME_MS  # playout starts once one frame of audio is queued (no network jitter to absorb)
MAX_MESSAGE_BYTES = 4 << 20
CONTROL_TYPES = PUSH_CONTROLS


class PushSession(Session):
    """A session fed by :class:`PushAudio` instead of a remote track; its peer connection is never used."""

    def __init__(self, *args: Any, push: PushAudio, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.push = push
        self.socket: web.WebSocketResponse | None = None
        self.messages = 0
        self.errors = 0

    def counters(self) -> dict[str, int]:
        return {
            **super().counters(),
            "push_bytes_in": self.push.received_bytes,
            "push_bytes_refused": self.push.refused_bytes,
            "interrupts": self.stream.stats.interrupts,
        }

    def attach(self, socket: web.WebSocketResponse) -> None:
        self.socket = socket
        self.cancel_timer("socket")

    def detach(self, socket: web.WebSocketResponse, grace_s: float) -> None:
        if self.socket is socket:
            self.socket = None
            if not self._closing:
                self.close_after("socket", grace_s, f"no audio socket for {grace_s:g} s")

    def interrupt(self) -> int:
        """Drop everything queued; returns the first frame index that leaves at rest and silent."""
        self.push.interrupt()
        self.stream.interrupt()
        timeline = self.stream.timeline
        if timeline is None:
            return 0
        now = self.stream.clock.now()
        index = max(0, self.stream.latest_index + 1)
        while index > 0 and self.stream.present_time(index - 1) > now:
            index -= 1
        return index

    async def release(self) -> None:
        if self.socket is not None:
            await self.socket.close(message=b"session closed")
        await super().release()


def create_push_session(
    manager: SessionManager, avatar_name: str | None, input_rate_hz: int, enhance: EnhanceChoice | None = None
) -> PushSession:
    """A new push session with its media clock running, or an :class:`ApiError` leaving nothing behind.
    ``enhance``: its face post-processing (``SessionManager.enhance_choice``; None: the server default)."""
    settings = manager.settings
    enhance = enhance or manager.enhance_choice()
    avatar = manager.admit(avatar_name)
    session_id = secrets.token_urlsafe(9)
    buffer = InputAudioBuffer(
        MEDIA_SAMPLE_RATE_HZ,
        target_ms=PUSH_START_MS,
        trim_hysteresis_ms=None,  # pushed audio is never trimmed
        max_ms=settings.push_buffer_s * 1000.0 + 1000.0,  # never reached: PushAudio refuses first
    )
    detector = SpeechDetector(MEDIA_SAMPLE_RATE_HZ, settings.vad_aggressiveness)
    stream = manager.new_stream(session_id, avatar, buffer, enhance.effective_strength)
    push = PushAudio(
        buffer,
        detector,
        input_rate_hz=input_rate_hz,
        max_buffer_s=settings.push_buffer_s,
        tick_samples=stream.samples_per_tick,
    )
    session = PushSession(
        session_id, RTCPeerConnection(), avatar, stream, buffer, detector, manager, "push", push=push
    )
    manager.register(session)
    stream.start()
    session.close_after(
        "socket", settings.push_grace_s, f"no audio socket within {settings.push_grace_s:g} s"
    )
    if settings.max_session_s:
        limit = settings.max_session_s
        session.close_after("limit", limit, f"session time limit of {limit:g} s reached")
    logger.info("[%s] push session created (avatar %s, %d Hz in)", session_id, avatar.name, input_rate_hz)
    return session


def parse_push_request(body: dict[str, Any]) -> tuple[str | None, int]:
    avatar = body.get("avatar")
    if avatar is not None and not isinstance(avatar, str):
        raise BadRequestError("'avatar' must be a string")
    rate = body.get("sample_rate_hz")
    if (
        not isinstance(rate, int)
        or isinstance(rate, bool)
        or not MIN_INPUT_RATE_HZ <= rate <= MAX_INPUT_RATE_HZ
    ):
        raise BadRequestError(
            f"'sample_rate_hz' must be an integer from {MIN_INPUT_RATE_HZ} to {MAX_INPUT_RATE_HZ}"
        )
    if body.get("encoding", "pcm16") != "pcm16":
        raise BadRequestError("'encoding' must be \"pcm16\" (signed 16-bit little-endian)")
    if body.get("channels", 1) != 1:
        raise BadRequestError("'channels' must be 1 (mono)")
    return avatar, rate


async def create(request: web.Request) -> web.Response:
    require_bearer(request)
    runtime = runtime_of(request)
    body = await read_json_object(request)
    avatar_name, rate = parse_push_request(body)
    enhance = runtime.sessions.enhance_choice(body.get(MODE_FIELD), body.get(STRENGTH_FIELD))
    session = create_push_session(runtime.sessions, avatar_name, rate, enhance)
    sid = session.id
    base = request.url.with_path("/").with_query(None)
    ws_base = base.with_scheme("wss" if base.scheme == "https" else "ws")
    info: PushSessionInfo = {
        "session_id": sid,
        "avatar": session.avatar.name,
        "sample_rate_hz": rate,
        "audio_url": str(ws_base.with_path(f"/sessions/{sid}/audio")),
        "whep_url": str(base.with_path(f"/whep/{sid}")),
        "viewer_url": str(base.with_path("/static/viewer.html").with_query(session=sid)),
        "session_url": str(base.with_path(f"/sessions/{sid}")),
        "push_buffer_s": runtime.settings.push_buffer_s,
    }
    return web.json_response(info, status=201, headers={"Location": f"/sessions/{sid}"})


def push_session(request: web.Request) -> PushSession:
    session = runtime_of(request).sessions.get(request.match_info["session_id"])
    if not isinstance(session, PushSession):
        raise NotFoundError(f"no push session {session.id!r}")
    return session


async def send_json(socket: web.WebSocketResponse, message: dict[str, Any]) -> None:
    if not socket.closed:
        await socket.send_json(message)


async def error(socket: web.WebSocketResponse, session: PushSession, code: str, message: str) -> None:
    session.errors += 1
    logger.info("[%s] push input refused (%s): %s", session.id, code, message)
    await send_json(socket, {"type": "error", "code": code, "message": message})


async def handle_control(socket: web.WebSocketResponse, session: PushSession, text: str) -> None:
    try:
        message = json.loads(text)
    except json.JSONDecodeError as e:
        await error(socket, session, "bad_json", f"control message is not valid JSON: {e}")
        return
    kind = message.get("type") if isinstance(message, dict) else None
    if kind == "interrupt":
        frame = session.interrupt()
        await send_json(socket, {"type": "interrupted", "frame": frame})
    elif kind == "end_of_speech":
        session.push.end_of_speech()
        await send_json(socket, {"type": "flushed", "queued_s": round(session.push.queued_s, 3)})
    elif kind == "close":
        await session.close("closed by the push client")
    else:
        await error(
            socket,
            session,
            "unknown_message",
            f'unknown control message {kind!r}; expected {{"type": one of {list(CONTROL_TYPES)}}}',
        )


async def audio_socket(request: web.Request) -> web.WebSocketResponse:
    require_bearer(request)
    session = push_session(request)
    if session.socket is not None:
        raise ConflictError(f"push session {session.id!r} already has an audio socket")
    settings = runtime_of(request).settings
    socket = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=10.0)
    await socket.prepare(request)
    session.attach(socket)
    try:
        async for msg in socket:
            session.messages += 1
            if msg.type == WSMsgType.BINARY:
                try:
                    session.push.push(msg.data)
                except PushBufferFull as e:
                    await error(socket, session, "buffer_full", str(e))
            elif msg.type == WSMsgType.TEXT:
                await handle_control(socket, session, msg.data)
            elif msg.type == WSMsgType.ERROR:
                logger.info("[%s] audio socket error: %s", session.id, socket.exception())
    finally:
        session.detach(socket, settings.push_grace_s)
    return socket


def setup(app: web.Application) -> None:
    app.router.add_post("/sessions", create)
    app.router.add_get("/sessions/{session_id}/audio", audio_socket)
