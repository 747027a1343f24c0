"""Small, deliberate adjustments to aiortc for latency.

aiortc's audio receiver holds 4 Opus packets (about 80 ms) in its jitter buffer before it decodes the first
one. lipcast has its own inbound jitter buffer (:mod:`streaming.audio_buffer`) sized in milliseconds, so the
receiver's is reduced to the minimum (one packet of look-behind for reordering). This reaches into a private
attribute; if a future aiortc renames it the function logs and leaves the receiver as it is.
"""

from __future__ import annotations

import logging

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
