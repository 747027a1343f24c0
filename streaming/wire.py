"""What crosses the network between the server and its clients, in one place: both sides import it.

The server (:mod:`lipcast.server`) writes these messages; the harness (:mod:`lipcast.probe`) and the tests
read them. ``docs/http-api.md`` describes the same shapes for other clients.

* the ``meta`` data channel: one JSON object per video frame sent (:class:`FrameMeta`, read back as
  :class:`MetaMessage`); a caller opens the channel with the label :data:`META_CHANNEL_LABEL`;
* the session JSON: the answer to ``POST /offer`` (:class:`OfferAnswer`), an avatar's description
  (:func:`avatar_json`), a push session's description (:class:`PushSessionInfo`);
* the push socket's control messages (:data:`PUSH_CONTROLS` in, :data:`PUSH_REPLIES` out);
* WHIP and WHEP bodies: :data:`SDP_CONTENT_TYPE`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict, cast

from lipcast.pipeline.avatar import Avatar

META_CHANNEL_LABEL = "meta"
SDP_CONTENT_TYPE = "application/sdp"  # WHIP and WHEP offers and answers (RFC 9725)

# Push sessions' WebSocket: text messages are JSON ``{"type": ...}`` with one of these types in ...
PUSH_CONTROLS = ("interrupt", "end_of_speech", "close")
# ... and these out: ``error`` (code, message), ``interrupted`` (frame), ``flushed`` (queued_s).
PUSH_REPLIES = ("error", "interrupted", "flushed")


@dataclass
class FrameMeta:
    """Per-frame metadata, sent on the ``meta`` channel as the frame leaves (and observed into metrics)."""

    frame: int
    avatar_frame: int
    input_pos_ms: float | None
    speech: bool
    active: bool  # the lip-sync backend rendered this frame (False: the avatar at rest)
    mouth: list[float]
    late: bool
    stages_ms: dict[str, float] = field(default_factory=dict)
    rx: dict[str, float] | None = None  # the caller's inbound audio so far (MetaMessage.rx)

    def to_json(self) -> MetaMessage:
        message: MetaMessage = {
            "frame": self.frame,
            "avatar_frame": self.avatar_frame,
            "audio_ms": self.input_pos_ms,
            "speech": self.speech,
            "active": self.active,
            "mouth": self.mouth,
            "late": self.late,
            "stages_ms": self.stages_ms,
        }
        if self.rx is not None:
            message["rx"] = self.rx
        return message

    def encode(self) -> str:
        """The channel's text message."""
        return json.dumps(self.to_json(), separators=(",", ":"))


class MetaMessage(TypedDict):
    """One ``meta`` channel message as a client parses it."""

    frame: int  # the frame's number on the session's media clock (RTP timestamp / 3600)
    avatar_frame: int  # the avatar frame it shows
    audio_ms: float | None  # position in the caller's audio of the first sample carried (None: none yet)
    speech: bool  # voice activity in that audio
    active: bool
    mouth: list[float]  # the mouth's opening features the frame was rendered from
    late: bool  # the render missed its budget: the previous picture was repeated
    stages_ms: dict[str, float]  # per-stage timings of this frame
    # A caller's inbound audio so far: packets lost (concealed), concealed_ms, fec (lost packets rebuilt from
    # in-band FEC), late (dropped: arrived after their slot), reordered, and the jitter buffer's target_ms.
    rx: NotRequired[dict[str, float]]


def parse_meta(message: str) -> MetaMessage:
    return cast(MetaMessage, json.loads(message))


class AvatarJson(TypedDict):
    name: str
    width: int
    height: int
    frames: int
    idle: str  # loop (a video's frames), breathing (a photo's) or still
    preview_url: str
    mouth_box: list[int]  # x1, y1, x2, y2: where the mouth moves in frame 0 (a probe measures motion there)


def avatar_json(avatar: Avatar) -> AvatarJson:
    mouth = avatar.mouth(0)
    pad_x = mouth.width * 0.25
    return {
        "name": avatar.name,
        "width": avatar.width,
        "height": avatar.height,
        "frames": int(avatar.meta.get("source_frames", avatar.frame_count)),
        "idle": avatar.meta.get("idle", "loop"),
        "preview_url": f"/avatars/{avatar.name}/preview.png",
        "mouth_box": [
            round(mouth.left_x - pad_x),
            round(min(mouth.left_y, mouth.right_y, mouth.lip_y) - mouth.width * 0.3),
            round(mouth.right_x + pad_x),
            round(mouth.chin_y),
        ],
    }


class OfferAnswer(TypedDict):
    """``POST /offer``'s answer."""

    sdp: str
    type: str  # "answer"
    session_id: str
    avatar: AvatarJson
    size: str  # the video's WIDTHxHEIGHT
    codec: str | None  # the video codec (vp8, h264)


class PushSessionInfo(TypedDict):
    """``POST /sessions``'s answer (201): where a push session's audio goes and where it can be watched."""

    session_id: str
    avatar: str
    sample_rate_hz: int
    audio_url: str  # the WebSocket for PCM and control messages
    whep_url: str
    viewer_url: str
    session_url: str
    push_buffer_s: float
