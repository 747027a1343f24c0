"""A pipecat frame processor that makes a lipcast avatar speak a pipeline's TTS (extra: ``lipcast[pipecat]``).

Place it after the TTS service::

    avatar = LipcastAvatar("http://127.0.0.1:8080", sample_rate_hz=24000)
    pipeline = Pipeline([..., llm, tts, avatar, transport.output()])

On pipecat's ``StartFrame`` it creates a lipcast push session (``POST /sessions``) and opens its audio socket;
``avatar.session`` then holds the session's ``whep_url`` and ``viewer_url`` for the user to watch (also
logged, and passed to the optional ``on_session`` callback). ``TTSAudioRawFrame`` audio is sent to the
session (and forwarded downstream unchanged, unless ``forward_audio=False``); ``TTSStoppedFrame`` flushes
the utterance (``end_of_speech``); pipecat's ``InterruptionFrame`` (the user barged in) sends ``interrupt``,
which silences the avatar and puts its mouth at rest within a frame; ``EndFrame`` and ``CancelFrame`` close
the session. Only pipecat's public API is used (``FrameProcessor.process_frame`` and ``push_frame``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

logger = logging.getLogger(__name__)


class LipcastAvatar(FrameProcessor):
    def __init__(
        self,
        base_url: str,
        *,
        sample_rate_hz: int = 24_000,
        avatar: str | None = None,
        token: str | None = None,
        forward_audio: bool = True,
        on_session: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url.rstrip("/")
        self.sample_rate_hz = sample_rate_hz
        self.avatar = avatar
        self.token = token
        self.forward_audio = forward_audio
        self.on_session = on_session
        self.session: dict[str, Any] | None = None
        self.errors: list[dict[str, Any]] = []  # the server's error messages (e.g. buffer_full)
        self.sent_bytes = 0
        self._http: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            await self._open()
        elif isinstance(frame, InterruptionFrame):
            await self._send_control("interrupt")
        elif isinstance(frame, TTSAudioRawFrame):
            await self._send_audio(frame)
            if not self.forward_audio:
                return
        elif isinstance(frame, TTSStoppedFrame):
            await self._send_control("end_of_speech")
        elif isinstance(frame, (EndFrame, CancelFrame)):
            await self._close()
        await self.push_frame(frame, direction)

    async def cleanup(self) -> None:
        await super().cleanup()
        await self._close()

    async def _open(self) -> None:
        if self._socket is not None:
            return
        self._http = aiohttp.ClientSession()
        body: dict[str, Any] = {"sample_rate_hz": self.sample_rate_hz, "encoding": "pcm16", "channels": 1}
        if self.avatar:
            body["avatar"] = self.avatar
        async with self._http.post(f"{self.base_url}/sessions", json=body, headers=self._headers()) as r:
            data = await r.json(content_type=None)
            if r.status != 201:
                await self._http.close()
                self._http = None
                raise RuntimeError(f"lipcast refused the push session: HTTP {r.status} {data}")
        self.session = dict(data)
        self._socket = await self._http.ws_connect(data["audio_url"], headers=self._headers())
        self._reader = asyncio.create_task(self._read(self._socket), name="lipcast-avatar-replies")
        logger.info("lipcast avatar: watch at %s (WHEP %s)", data["viewer_url"], data["whep_url"])
        if self.on_session is not None:
            await self.on_session(self.session)

    async def _read(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in socket:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            reply = json.loads(msg.data)
            if reply.get("type") == "error":
                self.errors.append(reply)
                logger.warning("lipcast avatar: %s: %s", reply.get("code"), reply.get("message"))

    async def _send_audio(self, frame: TTSAudioRawFrame) -> None:
        if self._socket is None or self._socket.closed:
            return
        if frame.sample_rate != self.sample_rate_hz or frame.num_channels != 1:
            raise ValueError(
                f"lipcast avatar expects {self.sample_rate_hz} Hz mono TTS audio, got "
                f"{frame.sample_rate} Hz x {frame.num_channels}; set sample_rate_hz to the TTS's rate"
            )
        await self._socket.send_bytes(frame.audio)
        self.sent_bytes += len(frame.audio)

    async def _send_control(self, kind: str) -> None:
        if self._socket is not None and not self._socket.closed:
            await self._socket.send_str(json.dumps({"type": kind}))

    async def _close(self) -> None:
        socket, self._socket = self._socket, None
        if socket is not None and not socket.closed:
            await socket.send_str(json.dumps({"type": "close"}))
            await socket.close()
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()
