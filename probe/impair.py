"""Network impairment inside the probe's own transport: RTP lost, delayed, reordered and rate-limited.

This box has no netem and tests run unprivileged, so the probe impairs its peer connection in user space:
the datagrams its ICE transport sends (``up``: probe -> server) or receives (``down``: server -> probe) pass
through an :class:`ImpairedPath` first. Only SRTP media packets are impaired (RFC 7983's first byte 128-191,
RTCP excluded): STUN, DTLS, the data channel and RTCP pass untouched, so the call still connects and its
feedback still flows, and what is measured is what media loss and jitter do.

A path applies, in this order:

* **loss** -- a Gilbert-Elliott channel: bursts of ``burst`` packets on average, ``loss`` of all packets
  lost in the long run (``burst=1`` is independent random loss);
* **rate** -- a link of ``rate_kbps`` with a drop-tail queue of ``queue_ms``: a packet waits for the link,
  and one that would wait longer is dropped;
* **delay and jitter** -- each packet is held ``delay_ms`` plus a uniform draw in ``+- jitter_ms``
  (never below zero), independently, so packets overtake one another when the jitter exceeds their spacing.

``from`` and ``until`` (seconds after the path's first media packet) bound the impaired stretch: outside it
packets pass untouched, so one call shows the network before, during and after (how fast a call recovers
once the jitter stops).

Every draw comes from one ``random.Random(seed)`` per path: the same seed and the same packets give the same
fate, packet for packet.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiortc.sdp import SessionDescription

DIRECTIONS = ("up", "down", "both")
DEFAULT_QUEUE_MS = 300.0
_FIELD = re.compile(r"^\s*([a-z]+)\s*=\s*([0-9.]+)\s*([a-z%]*)\s*$")
_UNITS = {
    "loss": {"%": 0.01, "": 1.0},
    "burst": {"": 1.0},
    "delay": {"ms": 1.0, "s": 1000.0, "": 1.0},
    "jitter": {"ms": 1.0, "s": 1000.0, "": 1.0},
    "rate": {"kbps": 1.0, "mbps": 1000.0, "": 1.0},
    "queue": {"ms": 1.0, "s": 1000.0, "": 1.0},
    "from": {"s": 1.0, "ms": 0.001, "": 1.0},
    "until": {"s": 1.0, "ms": 0.001, "": 1.0},
}
_KEYS = {
    "delay": "delay_ms",
    "jitter": "jitter_ms",
    "rate": "rate_kbps",
    "queue": "queue_ms",
    "from": "from_s",
    "until": "until_s",
}


class ImpairmentError(ValueError):
    pass


@dataclass(frozen=True)
class Impairment:
    loss: float = 0.0  # long-run share of media packets lost, 0..1
    burst: float = 1.0  # mean length of a loss burst, packets (>= 1)
    delay_ms: float = 0.0
    jitter_ms: float = 0.0  # each packet's delay is delay_ms + uniform(-jitter_ms, +jitter_ms), >= 0
    rate_kbps: float | None = None  # None: no rate limit
    queue_ms: float = DEFAULT_QUEUE_MS  # the rate-limited link's queue, in time at that rate
    # The impaired stretch, seconds after the path's first media packet (None: to the end): outside it
    # packets pass untouched, so a run shows the call before, during and after the impairment.
    from_s: float = 0.0
    until_s: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss < 1.0:
            raise ImpairmentError("loss must be in 0..100 %")
        if self.burst < 1.0:
            raise ImpairmentError("burst must be at least 1 packet")
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.queue_ms < 0:
            raise ImpairmentError("delay, jitter and queue must be >= 0")
        if self.rate_kbps is not None and self.rate_kbps <= 0:
            raise ImpairmentError("rate must be > 0")
        if self.from_s < 0 or (self.until_s is not None and self.until_s <= self.from_s):
            raise ImpairmentError("from must be >= 0 and until later than from")

    @classmethod
    def parse(cls, text: str) -> Impairment:
        """``"loss=2%,burst=4,delay=40ms,jitter=30ms,rate=300kbps,queue=200ms,from=10s,until=30s"``; any
        subset, any order."""
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = _FIELD.match(part.lower())
            if match is None or match.group(1) not in _UNITS:
                raise ImpairmentError(f"cannot read {part!r}: expected one of {', '.join(_UNITS)}=VALUE")
            name, number, unit = match.groups()
            scale = _UNITS[name].get(unit)
            if scale is None:
                raise ImpairmentError(f"{name} takes {' or '.join(u or 'no unit' for u in _UNITS[name])}")
            values[_KEYS.get(name, name)] = float(number) * scale
        return cls(**values)

    @property
    def active(self) -> bool:
        return bool(self.loss or self.delay_ms or self.jitter_ms or self.rate_kbps)


@dataclass(frozen=True)
class Network:
    """The impairment of a run's calls (picklable: the probe's client processes get it too)."""

    impairment: Impairment
    direction: str = "up"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ImpairmentError(f"direction must be one of {', '.join(DIRECTIONS)}")


@dataclass
class PathStats:
    packets: int = 0  # media packets that entered the path while it impaired (from..until)
    lost: int = 0  # by the loss model
    queue_drops: int = 0  # by the rate-limited link's full queue
    delivered: int = 0
    reordered: int = 0  # delivered after a packet that entered the path later
    max_queue_ms: float = 0.0
    first_packet_at: float | None = None  # the path's clock (the loop's: time.monotonic) at its first packet
    # Media bytes that entered the path (what the sender sent), per second since its first packet.
    bytes_by_second: list[int] = field(default_factory=list)
    video_bytes_by_second: list[int] = field(default_factory=list)  # of them, not of the audio's types

    def to_json(self) -> dict[str, float | int]:
        per_second = ("first_packet_at", "bytes_by_second", "video_bytes_by_second")
        counts = {k: v for k, v in vars(self).items() if k not in per_second}
        return {**counts, "max_queue_ms": round(self.max_queue_ms, 1)}

    def impaired_between(self, impairment: Impairment) -> tuple[float, float | None] | None:
        """The stretch the path impaired, on its clock (None before the first packet)."""
        if self.first_packet_at is None:
            return None
        start = self.first_packet_at + impairment.from_s
        return start, None if impairment.until_s is None else self.first_packet_at + impairment.until_s


class GilbertElliott:
    """Two states: good (nothing lost) and bad (everything lost); leaving bad has probability 1 / burst."""

    def __init__(self, loss: float, burst: float, rng: random.Random) -> None:
        self.rng = rng
        self.leave_bad = 1.0 / burst
        # stationary share of bad = enter / (enter + leave) = loss
        self.enter_bad = loss * self.leave_bad / (1.0 - loss) if loss else 0.0
        self.bad = False

    def lost(self) -> bool:
        if self.bad:
            self.bad = self.rng.random() >= self.leave_bad
        else:
            self.bad = self.rng.random() < self.enter_bad
        return self.bad


def is_media(datagram: bytes) -> bool:
    """An SRTP packet (not SRTCP): RFC 7983 demultiplexing, then RTCP's payload types 192-223."""
    return len(datagram) >= 2 and 127 < datagram[0] < 192 and not 192 <= datagram[1] <= 223


def payload_type(datagram: bytes) -> int:
    """An (S)RTP packet's payload type: its header is not encrypted (-1: too short to say)."""
    return datagram[1] & 0x7F if len(datagram) > 1 else -1


@dataclass
class ImpairedPath:
    """One direction: :meth:`push` a media datagram; ``deliver`` gets it later, or never."""

    impairment: Impairment
    deliver: Callable[[bytes], Awaitable[None] | None]
    seed: int = 0
    clock: Callable[[], float] | None = None  # seconds; the running loop's time if None
    stats: PathStats = field(default_factory=PathStats)
    # The negotiated audio payload types: every other media packet counts as video in the stats.
    audio_payload_types: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.loss = GilbertElliott(self.impairment.loss, self.impairment.burst, self.rng)
        self._link_free_at = 0.0
        self._entered = 0
        self._newest_delivered = -1
        self._tasks: set[asyncio.Task[None]] = set()

    def _now(self) -> float:
        return self.clock() if self.clock else asyncio.get_running_loop().time()

    def fate(self, size_bytes: int, now: float, *, video: bool = True) -> float | None:
        """When a packet entering now leaves the path (seconds, on the path's clock), or None: dropped."""
        imp = self.impairment
        if self.stats.first_packet_at is None:
            self.stats.first_packet_at = now
        elapsed_s = now - self.stats.first_packet_at
        second = int(elapsed_s)
        sent = self.stats.bytes_by_second
        sent.extend([0] * (second + 1 - len(sent)))
        sent[second] += size_bytes
        sent_video = self.stats.video_bytes_by_second
        sent_video.extend([0] * (second + 1 - len(sent_video)))
        sent_video[second] += size_bytes if video else 0
        if elapsed_s < imp.from_s or (imp.until_s is not None and elapsed_s >= imp.until_s):
            return now
        self.stats.packets += 1
        if self.loss.lost():
            self.stats.lost += 1
            return None
        leaves = now
        if imp.rate_kbps is not None:
            start = max(now, self._link_free_at)
            wait_ms = (start - now) * 1000.0
            if wait_ms > imp.queue_ms:
                self.stats.queue_drops += 1
                return None
            self.stats.max_queue_ms = max(self.stats.max_queue_ms, wait_ms)
            self._link_free_at = start + size_bytes * 8 / (imp.rate_kbps * 1000.0)
            leaves = self._link_free_at
        delay_ms = imp.delay_ms
        if imp.jitter_ms:
            delay_ms = max(0.0, delay_ms + self.rng.uniform(-imp.jitter_ms, imp.jitter_ms))
        return leaves + delay_ms / 1000.0

    def push(self, datagram: bytes) -> None:
        now = self._now()
        video = payload_type(datagram) not in self.audio_payload_types
        leaves = self.fate(len(datagram), now, video=video)
        if leaves is None:
            return
        order = self._entered
        self._entered += 1
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + max(0.0, leaves - now), self._release, datagram, order)

    def _release(self, datagram: bytes, order: int) -> None:
        self.stats.delivered += 1
        if order < self._newest_delivered:
            self.stats.reordered += 1
        self._newest_delivered = max(self._newest_delivered, order)
        result = self.deliver(datagram)
        if result is not None:
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


class ImpairedTransport:
    """Impairs one aiortc ``RTCIceTransport`` by replacing its ``_send`` / ``_recv`` (what DTLS calls)."""

    def __init__(
        self,
        transport: Any,
        impairment: Impairment,
        direction: str,
        seed: int,
        audio_payload_types: frozenset[int] = frozenset(),
    ) -> None:
        if direction not in DIRECTIONS:
            raise ImpairmentError(f"direction must be one of {', '.join(DIRECTIONS)}")
        self.up: ImpairedPath | None = None
        self.down: ImpairedPath | None = None
        self._pump: asyncio.Task[None] | None = None
        send: Callable[[bytes], Awaitable[None]] = transport._send
        recv: Callable[[], Awaitable[bytes]] = transport._recv
        if direction in ("up", "both"):

            async def send_later(data: bytes) -> None:
                with contextlib.suppress(ConnectionError):  # the call ended while it was in flight
                    await send(data)

            up = self.up = ImpairedPath(
                impairment, send_later, seed=seed, audio_payload_types=audio_payload_types
            )

            async def impaired_send(data: bytes) -> None:
                if is_media(data):
                    up.push(data)
                else:
                    await send(data)

            transport._send = impaired_send
        if direction in ("down", "both"):
            inbox: asyncio.Queue[bytes | Exception] = asyncio.Queue()
            down = self.down = ImpairedPath(
                impairment, inbox.put_nowait, seed=seed + 1, audio_payload_types=audio_payload_types
            )

            async def pump() -> None:
                while True:
                    try:
                        data = await recv()
                    except Exception as e:  # handed to the reader, as recv itself would raise it
                        inbox.put_nowait(e)
                        return
                    if is_media(data):
                        down.push(data)
                    else:
                        inbox.put_nowait(data)

            async def impaired_recv() -> bytes:
                if self._pump is None:  # started by the first read: ICE refuses reads until it connects
                    self._pump = asyncio.get_running_loop().create_task(pump())
                item = await inbox.get()
                if isinstance(item, Exception):
                    inbox.put_nowait(item)  # every later reader sees the end too
                    raise item
                return item

            transport._recv = impaired_recv

    def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()

    def stats_json(self) -> dict[str, dict[str, float | int]]:
        out = {}
        if self.up is not None:
            out["up"] = self.up.stats.to_json()
        if self.down is not None:
            out["down"] = self.down.stats.to_json()
        return out


def impair_peer_connection(pc: Any, impairment: Impairment, direction: str, seed: int) -> ImpairedTransport:
    """Impair ``pc``'s ICE transport (the one every track and the data channel share once bundled).

    Call it after ``setRemoteDescription`` (the answer decides the bundle) and before the connection carries
    media: ICE checks and the DTLS handshake come first (and pass untouched)."""
    transports = {
        id(t.sender.transport.transport): t.sender.transport.transport for t in pc.getTransceivers()
    }
    if pc.sctp is not None:
        transports.setdefault(id(pc.sctp.transport.transport), pc.sctp.transport.transport)
    if len(transports) != 1:
        raise ImpairmentError(f"expected one bundled transport, found {len(transports)}")
    audio = frozenset(
        codec.payloadType
        for media in SessionDescription.parse(pc.remoteDescription.sdp).media
        if media.kind == "audio"
        for codec in media.rtp.codecs
        if codec.payloadType is not None
    )
    return ImpairedTransport(next(iter(transports.values())), impairment, direction, seed, audio)
