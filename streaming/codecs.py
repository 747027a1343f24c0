"""Which video codec a negotiated transceiver sends: the one the server chose from the offer
(:func:`lipcast.streaming.offers.choose_video_codec`), its retransmissions (RTX) beside it.

aiortc answers with the codecs common to the offer and its own list, in the offer's order, and sends the
first. A caller's transceiver is made by ``setRemoteDescription``; :func:`send_only_codec` then keeps only
the chosen codec (and its RTX) for the answer. A viewer's transceiver is made before the offer is applied;
:func:`codec_preferences` are what its ``setCodecPreferences`` takes.
"""

from __future__ import annotations

import logging

from aiortc import RTCRtpSender, RTCRtpTransceiver
from aiortc.rtcrtpparameters import RTCRtpCodecCapability

from lipcast.streaming.encoders import MIME_TYPES

logger = logging.getLogger(__name__)
RTX = "video/rtx"


def codec_preferences(codec: str) -> list[RTCRtpCodecCapability]:
    """aiortc's capabilities of ``codec`` (lipcast's name) and RTX, for ``setCodecPreferences``."""
    wanted = (MIME_TYPES[codec], RTX)
    return [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType.lower() in wanted]


def send_only_codec(transceiver: RTCRtpTransceiver, codec: str) -> bool:
    """Keep only ``codec`` (and the RTX of what is kept) among a negotiated transceiver's codecs, so the
    answer names it and the sender uses it. Returns whether the transceiver was changed."""
    codecs = getattr(transceiver, "_codecs", None)
    if not isinstance(codecs, list):
        logger.warning("aiortc internals changed: the video codec is the offer's first")
        return False
    mime = MIME_TYPES[codec]
    kept = [c for c in codecs if c.mimeType.lower() == mime]
    if not kept:
        return False
    types = {c.payloadType for c in kept}
    rtx = [c for c in codecs if c.mimeType.lower() == RTX and c.parameters.get("apt") in types]
    transceiver._codecs = kept + rtx
    return True


def sent_codec(transceiver: RTCRtpTransceiver) -> str | None:
    """lipcast's name of the codec a negotiated transceiver sends (None: not one of lipcast's)."""
    codecs = getattr(transceiver, "_codecs", None) or []
    first = next((c.mimeType.lower() for c in codecs if c.mimeType.lower() != RTX), None)
    return next((name for name, mime in MIME_TYPES.items() if mime == first), None)
