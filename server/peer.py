"""What a caller's session and a WHEP viewer have in common: one peer connection, a ``meta`` data channel
whose messages wait until it opens, a connect timeout, and an idempotent close that callbacks can trigger.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from aiortc import RTCPeerConnection
from aiortc.rtcdatachannel import RTCDataChannel

from lipcast.pipeline.timing import FPS
from lipcast.streaming.tasks import session_log
from lipcast.streaming.wire import META_CHANNEL_LABEL, FrameMeta

logger = logging.getLogger(__name__)

META_BACKLOG = 10 * FPS  # frames of metadata kept until the channel opens (10 s)


class PeerEndpoint:
    """Subclasses release their own resources in :meth:`release` and say goodbye in :meth:`forget`."""

    def __init__(self, pc: RTCPeerConnection, tag: str) -> None:
        self.pc = pc
        self.tag = tag
        self.log = session_log(logger, tag)
        self.meta_channel: RTCDataChannel | None = None
        self.closed = asyncio.Event()
        self._meta_backlog: deque[str] = deque(maxlen=META_BACKLOG)
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        pc.on("datachannel", self.on_datachannel)
        pc.on("connectionstatechange", self.on_connection_state)

    @property
    def closing(self) -> bool:
        """A close has begun (nothing new may be started)."""
        return self._closing

    # -- events --------------------------------------------------------------------------------------------

    def on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label == META_CHANNEL_LABEL:
            self.meta_channel = channel

    def on_connection_state(self) -> None:
        state = self.pc.connectionState
        self.log.info("connection %s", state)
        if state == "connected":
            self.cancel_timer("connect")
            self.on_connected()
        elif state in ("failed", "closed"):
            self.schedule_close(f"connection {state}")

    def on_connected(self) -> None:
        """The connection came up (subclasses start their media here)."""

    def send_meta(self, meta: FrameMeta) -> None:
        """Send a frame's metadata; frames sent before the channel opened follow in order once it does."""
        message = meta.encode()
        channel = self.meta_channel
        if channel is None or channel.readyState != "open":
            self._meta_backlog.append(message)
            return
        while self._meta_backlog:
            channel.send(self._meta_backlog.popleft())
        channel.send(message)

    # -- timers --------------------------------------------------------------------------------------------

    def close_after(self, name: str, delay_s: float, reason: str) -> None:
        """Close in ``delay_s`` unless :meth:`cancel_timer` ``name`` comes first (or the close)."""
        self._timers[name] = asyncio.get_running_loop().call_later(delay_s, self.schedule_close, reason)

    def arm_connect_timeout(self, timeout_s: float) -> None:
        self.close_after("connect", timeout_s, f"not connected within {timeout_s:g} s")

    def cancel_timer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    # -- closing -------------------------------------------------------------------------------------------

    def schedule_close(self, reason: str) -> None:
        """Close from a callback (keeps a reference to the task)."""
        if self._close_task is None and not self._closing:
            self._close_task = asyncio.create_task(self.close(reason), name=f"close-{self.tag}")

    async def close(self, reason: str = "closed") -> None:
        """Release everything, once; later calls wait for the first to finish.

        The peer connection is closed even when releasing fails (that failure is logged here, once), and the
        owner's books are left last, whatever happened before.
        """
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        self.log.info("closing: %s", reason)
        for name in list(self._timers):
            self.cancel_timer(name)
        try:
            try:
                await self.release()
            except Exception:
                self.log.exception("releasing failed; closing the connection anyway")
            finally:
                await self.pc.close()
        finally:
            await self.forget()
            self.closed.set()

    async def release(self) -> None:
        """Stop what the subclass started (before the peer connection closes)."""

    async def forget(self) -> None:
        """Leave the owner's books (after everything is released)."""
