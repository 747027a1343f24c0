"""Lose one keyframe on purpose and time the mend: the probe asks for a keyframe (PLI) at a set second of the
call and its video receiver drops every packet of the keyframe that comes, retransmissions included (what a
burst on the downlink does to a keyframe: its ~10 packets are lost far more often than a delta frame's one or
two). The receiver then gives up on the missing packets as a browser does (:class:`MarkerJitterBuffer`) and
asks again; the figure is how long the picture stayed broken: from the last frame before the lost keyframe to
the release of the next keyframe (:func:`lipcast.probe.analysis.picture_recoveries_ms`).

The loss sits in the receiver, after SRTP: the impaired transport below it sees only encrypted payloads, so
it cannot tell a keyframe's packets from others."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiortc.jitterbuffer import JitterFrame

from lipcast.streaming.rtc import MarkerJitterBuffer, is_vp8_keyframe


def starts_vp8_keyframe(payload: bytes, depayloaded: bytes) -> bool:
    """Whether an RTP packet opens a VP8 keyframe: its payload descriptor starts partition 0 (S set, PID 0,
    RFC 7741 4.2) and the frame behind the descriptor is a keyframe."""
    return (
        len(payload) >= 1
        and payload[0] & 0x10 != 0
        and payload[0] & 0x07 == 0
        and is_vp8_keyframe(depayloaded)
    )


class KeyframeLosingJitterBuffer(MarkerJitterBuffer):
    """A video receiver's jitter buffer that, once :meth:`arm`-ed, drops every packet of the next keyframe."""

    def __init__(self, lost_at: list[float] | None = None) -> None:
        super().__init__()
        self.ssrc: int | None = None  # the sender's, for the PLI that provokes the keyframe
        self.armed_at: float | None = None
        self.lost_timestamp: int | None = None  # the RTP timestamp of the keyframe dropped
        self.lost_at = [] if lost_at is None else lost_at  # when its first packet came (time.monotonic)
        self.dropped_packets = 0
        self.receiving = asyncio.Event()  # set at the first packet

    def arm(self) -> None:
        if self.lost_timestamp is None:
            self.armed_at = time.monotonic()

    def add(self, packet: Any) -> tuple[bool, JitterFrame | None]:
        self.ssrc = packet.ssrc
        self.receiving.set()
        if self.lost_timestamp is None and self.armed_at is not None:
            if starts_vp8_keyframe(packet.payload, packet._data):
                self.lost_timestamp = packet.timestamp
                self.lost_at.append(time.monotonic())
        if self.lost_timestamp is not None and packet.timestamp == self.lost_timestamp:
            self.dropped_packets += 1
            return False, None
        return super().add(packet)
