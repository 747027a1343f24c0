"""The one offer validator: what an SDP offer must be, for each way in, checked before anything is built.

:func:`validate_offer` reads the text (``v=0``, then aiortc's parser, through
:func:`lipcast.streaming.offers.summarize_offer`); the ``check_*`` functions say what each kind of client must
ask for. Every failure is a :class:`~lipcast.server.errors.BadRequestError` (400) with a message for the
client. The HTTP shapes around the SDP (a JSON field, an ``application/sdp`` body) stay with their handlers.
"""

from __future__ import annotations

from typing import Any

from lipcast.server.errors import BadRequestError
from lipcast.streaming.offers import OfferError, OfferSummary, choose_video_codec, summarize_offer
from lipcast.streaming.sizes import OutputSize, SizeError, requested_size

MAX_SDP_BYTES = 64 * 1024


def validate_offer(text: str) -> OfferSummary:
    """The offer's media sections, or 400: empty, too long, or not SDP that parses."""
    if not text.strip():
        raise BadRequestError("the SDP offer is empty")
    if len(text) > MAX_SDP_BYTES:
        raise BadRequestError(f"the SDP offer is longer than {MAX_SDP_BYTES} bytes")
    try:
        return summarize_offer(text)
    except OfferError as e:
        raise BadRequestError(f"malformed SDP offer: {e}") from e


def check_call_offer(summary: OfferSummary) -> None:
    """The call page: sends the microphone and receives the avatar."""
    if not summary.of_kind("audio") or not summary.of_kind("video"):
        raise BadRequestError("the offer must send audio (the microphone) and receive video (the avatar)")


def check_whip_offer(summary: OfferSummary) -> None:
    """WHIP (RFC 9725): the client must send audio; what it receives is up to it."""
    if not summary.sends("audio"):
        raise BadRequestError("a WHIP offer must send audio (a=sendonly or a=sendrecv audio section)")


def check_viewer_offer(summary: OfferSummary) -> None:
    """WHEP: audio and/or video, at most one of each, each receiving (recvonly or sendrecv)."""
    media = [m for m in summary.media if m.kind in ("audio", "video")]
    if not media:
        raise BadRequestError("the offer has no audio or video section to receive the avatar on")
    for kind in ("audio", "video"):
        if len(summary.of_kind(kind)) > 1:
            raise BadRequestError(f"the offer has more than one {kind} section; WHEP sends one stream")
    for m in media:
        if not m.offerer_receives:
            raise BadRequestError(
                f"the offer's {m.kind} section must be recvonly (or sendrecv), not {m.direction}"
            )


def check_video_codec(summary: OfferSummary, preference: tuple[str, ...]) -> str | None:
    """The video codec for an offer that receives video: the first of the server's ``preference`` it
    lists; 400 naming both lists when it lists none of them. None for an offer without video."""
    if not summary.of_kind("video"):
        return None
    chosen = choose_video_codec(summary, preference)
    if chosen is None:
        offered = ", ".join(c.split("/", 1)[-1] for c in summary.codecs("video")) or "none"
        raise BadRequestError(
            f"the offer's video codecs ({offered}) include none of this server's ({', '.join(preference)})"
        )
    return chosen


def requested_output_size(fields: dict[str, Any], cap: OutputSize, prefix: str = "") -> OutputSize | None:
    """A request's ``size`` (or ``width`` and ``height``), or None; 400 naming the field if it is malformed
    or above ``cap`` (the server's ``max_output_size``)."""
    try:
        return requested_size(fields, cap, prefix=prefix)
    except SizeError as e:
        raise BadRequestError(str(e)) from None
