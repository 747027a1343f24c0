"""What an SDP offer asks for, read before any peer connection exists: its media sections and directions.

The HTTP layers need this to pick the right error before any resource exists: a WHIP offer must send audio,
a WHEP offer must only receive. aiortc's own parser does the reading; its errors become :class:`OfferError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiortc import sdp

from lipcast.streaming.encoders import MIME_TYPES

# The offerer's direction, as written in its offer.
SENDS = ("sendonly", "sendrecv")
RECEIVES = ("recvonly", "sendrecv")


class OfferError(ValueError):
    """The offer does not parse."""


@dataclass(frozen=True)
class MediaSection:
    kind: str  # audio | video | application
    direction: str | None  # sendrecv | sendonly | recvonly | inactive (None for application)
    codecs: tuple[str, ...] = ()  # the MIME types it lists, lower case ("video/vp8", "video/h264", ...)

    @property
    def offerer_sends(self) -> bool:
        return self.direction in SENDS

    @property
    def offerer_receives(self) -> bool:
        return self.direction in RECEIVES


@dataclass(frozen=True)
class OfferSummary:
    media: tuple[MediaSection, ...]

    def of_kind(self, kind: str) -> list[MediaSection]:
        return [m for m in self.media if m.kind == kind]

    def sends(self, kind: str) -> bool:
        return any(m.offerer_sends for m in self.of_kind(kind))

    def receives(self, kind: str) -> bool:
        return any(m.offerer_receives for m in self.of_kind(kind))

    def codecs(self, kind: str) -> tuple[str, ...]:
        """The MIME types the ``kind`` sections list, in the offer's order, once each."""
        seen: dict[str, None] = {}
        for section in self.of_kind(kind):
            seen.update(dict.fromkeys(section.codecs))
        return tuple(seen)


def choose_video_codec(summary: OfferSummary, preference: tuple[str, ...]) -> str | None:
    """The first of ``preference`` (lipcast's names: vp8, h264) that the offer's video lists; None if none
    is."""
    offered = summary.codecs("video")
    return next((name for name in preference if MIME_TYPES[name] in offered), None)


def summarize_offer(text: str) -> OfferSummary:
    """The offer's media sections; :class:`OfferError` if it does not parse."""
    if not text.lstrip().startswith("v=0"):
        raise OfferError("it must start with v=0")
    try:
        description = sdp.SessionDescription.parse(text)
    except Exception as e:  # aiortc's parser raises ValueError, AssertionError, KeyError, ...
        raise OfferError(str(e) or type(e).__name__) from e
    return OfferSummary(
        tuple(
            MediaSection(m.kind, m.direction, tuple(c.mimeType.lower() for c in m.rtp.codecs))
            for m in description.media
        )
    )
