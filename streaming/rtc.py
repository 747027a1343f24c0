"""Small, deliberate adjustments to aiortc: receive latency, and which addresses ICE offers.

aiortc's audio receiver holds 4 Opus packets (about 80 ms) in its jitter buffer before it decodes the first
one. lipcast has its own inbound jitter buffer (:mod:`streaming.audio_buffer`) sized in milliseconds, so the
receiver's is reduced to the minimum (one packet of look-behind for reordering). This reaches into a private
attribute; if a future aiortc renames it the function logs and leaves the receiver as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import aioice.ice
from aiortc import RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer

logger = logging.getLogger(__name__)

AUDIO_JITTER_CAPACITY_PACKETS = 16  # aiortc's own value (a power of two)
AUDIO_PREFETCH_PACKETS = 1
_ATTRIBUTE = "_RTCRtpReceiver__jitter_buffer"


def tune_receiver_latency(receiver: RTCRtpReceiver) -> bool:
    """Shrink an audio receiver's prefetch; returns whether it was applied."""
    if getattr(receiver, "_RTCRtpReceiver__kind", None) != "audio":
        return False
    if not isinstance(getattr(receiver, _ATTRIBUTE, None), JitterBuffer):
        logger.warning("aiortc internals changed: audio receive latency not tuned")
        return False
    setattr(
        receiver,
        _ATTRIBUTE,
        JitterBuffer(capacity=AUDIO_JITTER_CAPACITY_PACKETS, prefetch=AUDIO_PREFETCH_PACKETS),
    )
    return True


def restrict_host_addresses(addresses: Sequence[str]) -> None:
    """Offer only ``addresses`` as ICE host candidates (process-wide).

    For multi-homed servers (offer the public interface only) and for tests and measurements that must stay
    on loopback: aioice never offers 127.0.0.1 by itself.
    """
    chosen = list(addresses)

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses
