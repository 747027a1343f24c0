"""A push-session client (``POST /sessions`` and its audio WebSocket): for tests, ``lipcast probe --push``
and by hand. It records when each chunk of audio left and every JSON message the server sent back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt

from lipcast.probe.wish import auth_headers, post_json


@dataclass
class PushClient:
    http: aiohttp.ClientSession
    base_url: str
    session_id: str
    info: dict[str, Any]
    socket: aiohttp.ClientWebSocketResponse
    token: str | None = None
    sent_at: list[tuple[int, float]] = field(default_factory=list)  # (first input sample, monotonic s)
    replies: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    sent_samples: int = 0
    _reader: asyncio.Task[None] | None = None
    _reply: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def send_pcm(self, samples: npt.NDArray[np.int16]) -> None:
        self.sent_at.append((self.sent_samples, time.monotonic()))
        self.sent_samples += len(samples)
        await self.socket.send_bytes(samples.astype("<i2").tobytes())

    async def send_paced(
        self, samples: npt.NDArray[np.int16], rate_hz: int, *, speedup: float, chunk_ms: float = 100.0
    ) -> None:
        """Send ``samples`` in ``chunk_ms`` chunks, ``speedup`` times faster than real time."""
        chunk = max(1, round(rate_hz * chunk_ms / 1000))
        start = time.monotonic()
        for i in range(0, len(samples), chunk):
            await asyncio.sleep(max(0.0, start + i / rate_hz / speedup - time.monotonic()))
            await self.send_pcm(samples[i : i + chunk])

    async def control(self, kind: str) -> float:
        """Send a control message; returns when it left."""
        at = time.monotonic()
        await self.socket.send_str(json.dumps({"type": kind}))
        return at

    async def wait_reply(self, kind: str, timeout_s: float = 10.0, after: int = 0) -> dict[str, Any]:
        """The first reply of type ``kind`` among replies from index ``after`` on."""

        def found() -> dict[str, Any] | None:
            for _, r in self.replies[after:]:
                if r.get("type") == kind:
                    return r
            return None

        async with asyncio.timeout(timeout_s), self._reply:
            await self._reply.wait_for(lambda: found() is not None or self.socket.closed)
        reply = found()
        if reply is None:
            raise ConnectionError(f"socket closed before a {kind!r} reply")
        return reply

    async def _read(self) -> None:
        async for msg in self.socket:
            if msg.type == aiohttp.WSMsgType.TEXT:
                async with self._reply:
                    self.replies.append((time.monotonic(), json.loads(msg.data)))
                    self._reply.notify_all()
        async with self._reply:
            self._reply.notify_all()

    async def close(self, *, delete: bool = True) -> None:
        await self.socket.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if delete:
            with contextlib.suppress(aiohttp.ClientError):
                async with self.http.delete(
                    f"{self.base_url}/sessions/{self.session_id}", headers=auth_headers(self.token)
                ):
                    pass


async def create_push_session(
    http: aiohttp.ClientSession,
    base_url: str,
    sample_rate_hz: int,
    *,
    avatar: str | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"sample_rate_hz": sample_rate_hz, "encoding": "pcm16", "channels": 1}
    if avatar:
        body["avatar"] = avatar
    return await post_json(http, f"{base_url}/sessions", body, token, 201)


async def open_push(
    http: aiohttp.ClientSession,
    base_url: str,
    sample_rate_hz: int,
    *,
    avatar: str | None = None,
    token: str | None = None,
) -> PushClient:
    """Create a push session and open its audio socket."""
    info = await create_push_session(http, base_url, sample_rate_hz, avatar=avatar, token=token)
    socket = await http.ws_connect(info["audio_url"], headers=auth_headers(token))
    client = PushClient(http, base_url, info["session_id"], info, socket, token)
    client._reader = asyncio.create_task(client._read(), name=f"push-client-{client.session_id}")
    return client
