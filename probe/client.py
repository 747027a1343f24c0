"""One probe call: connect to a lipcast server over WebRTC, send known audio, record what comes back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from lipcast.probe.impair import ImpairedTransport, Network, impair_peer_connection
from lipcast.probe.keyframe_loss import KeyframeLosingJitterBuffer
from lipcast.probe.media import PatternAudioTrack, ReceivedAudio, ReceivedVideo, record_audio, record_video
from lipcast.streaming.codecs import codec_preferences
from lipcast.streaming.inbound import PlayoutTap
from lipcast.streaming.opus import OpusDecoder
from lipcast.streaming.playout import PacketPlayout, Released
from lipcast.streaming.rtc import (
    JITTER_BUFFER_ATTRIBUTE,
    MarkerJitterBuffer,
    encode_audio_on_loop,
    tune_receiver_latency,
    use_fast_audio_level,
    use_opus_fec,
)
from lipcast.streaming.sizes import OutputSize, placement
from lipcast.streaming.wire import META_CHANNEL_LABEL, MetaMessage, parse_meta


class ProbeError(RuntimeError):
    """The server refused the call or the connection did not come up."""


# The probe's own audio receiver waits this long for a missing packet, then conceals it: as a browser's
# does, so that a lossy downlink measures the server, not aiortc's receiver (which would hold every later
# packet until the missing one came or its ring overflowed).
PROBE_AUDIO_WAIT_MS = 40.0


def receive_audio_packets(receiver: Any, out: ReceivedAudio) -> bool:
    """Take the call's returned audio from ``receiver``'s packets: ordered, lost ones concealed, decoded to
    48 kHz mono into ``out`` with their release times. Returns whether it could (aiortc internals)."""
    if not hasattr(receiver, JITTER_BUFFER_ATTRIBUTE):
        return False

    def record(audio: Released) -> None:
        out.chunks.append(audio.samples)
        out.arrived_at.append(time.monotonic())
        out.starts.append(out.total)
        out.total += len(audio.samples)

    playout = PacketPlayout(OpusDecoder(), wait_ms_for=lambda: PROBE_AUDIO_WAIT_MS)
    setattr(receiver, JITTER_BUFFER_ATTRIBUTE, PlayoutTap(playout, record, time.monotonic))
    return True


def first_frame_offset(receiver: Any) -> int:
    """90 kHz ticks from the stream's first packet to the first frame aiortc's receiver released (its pts 0):
    nonzero when the first frames were lost or given up (0 when either is unknown)."""
    buffer = getattr(receiver, JITTER_BUFFER_ATTRIBUTE, None)
    mapper = getattr(receiver, "_RTCRtpReceiver__timestamp_mapper", None)
    origin = getattr(mapper, "_origin", None)
    if not isinstance(buffer, MarkerJitterBuffer) or buffer.first_timestamp is None or origin is None:
        return 0
    offset = (int(origin) - buffer.first_timestamp) % (1 << 32)
    return offset if offset < 1 << 31 else 0


async def lose_keyframe(receiver: Any, at_s: float) -> None:
    """``at_s`` after the first video packet: arm the receiver's keyframe loss and ask for a keyframe."""
    buffer = getattr(receiver, JITTER_BUFFER_ATTRIBUTE)
    assert isinstance(buffer, KeyframeLosingJitterBuffer)
    await buffer.receiving.wait()
    await asyncio.sleep(at_s)
    buffer.arm()
    await receiver._send_rtcp_pli(buffer.ssrc)


@dataclass(frozen=True)
class CallOptions:
    """How the probe makes each call (the same for every call of a run)."""

    # aiortc holds each received video frame until the next frame's first packet (40 ms at 25 fps, aiortc's
    # own receiver); marker releases it on its last packet, as a browser does.
    video_release: str = "aiortc"
    network: Network | None = None  # impair this call's RTP in the probe's own transport
    # Ask for a keyframe this many seconds into the call and lose it (probe.keyframe_loss); needs "marker".
    lose_keyframe_at_s: float | None = None
    size: str | None = None  # the video size asked for, WIDTHxHEIGHT (None: the avatar's own)
    codec: str | None = None  # the only video codec offered: vp8 or h264 (None: aiortc's list, VP8 first)


DEFAULT_OPTIONS = CallOptions()


@dataclass
class CallRecording:
    session_id: str
    avatar: dict[str, Any]
    source: PatternAudioTrack
    video: ReceivedVideo
    audio: ReceivedAudio
    meta: list[tuple[float, MetaMessage]] = field(default_factory=list)
    connected_at: float | None = None
    network: ImpairedTransport | None = None  # what the impairment did, if the call was impaired

    @property
    def sent(self) -> npt.NDArray[np.int16]:
        return self.source.audio


def output_region(answer: dict[str, Any]) -> tuple[int, int, int, int]:
    """The avatar's mouth box in the video's pixels: where the avatar lies in a video of another size."""
    avatar = answer["avatar"]
    x1, y1, x2, y2 = avatar["mouth_box"]
    size = answer.get("size")
    if not size:
        return (x1, y1, x2, y2)
    place = placement(int(avatar["width"]), int(avatar["height"]), OutputSize.parse(size))
    s = place.scale
    return (
        place.left + int(x1 * s),
        place.top + int(y1 * s),
        place.left + int(round(x2 * s)),
        place.top + int(round(y2 * s)),
    )


async def call(
    base_url: str,
    audio: npt.NDArray[np.int16],
    *,
    avatar: str | None = None,
    tail_s: float = 1.0,
    connect_timeout_s: float = 15.0,
    http: aiohttp.ClientSession | None = None,
    options: CallOptions = DEFAULT_OPTIONS,
) -> CallRecording:
    """Run one call: send ``audio`` (48 kHz mono int16) in real time, keep receiving ``tail_s`` longer."""
    use_fast_audio_level()  # the probe's senders too: it has to drive 40+ calls from a few cores
    use_opus_fec()  # as a browser does when the answer has useinbandfec=1 (lipcast's does)
    own_http = http is None
    http = http or aiohttp.ClientSession()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    source = PatternAudioTrack(audio)
    tasks: list[asyncio.Task[None]] = []
    connected = asyncio.Event()
    recording: CallRecording | None = None
    video, received_audio = ReceivedVideo(), ReceivedAudio()
    meta: list[tuple[float, MetaMessage]] = []
    region: list[tuple[int, int, int, int] | None] = [None]
    try:
        encode_audio_on_loop(pc.addTrack(source))  # as the server's senders: no thread hop per 20 ms packet
        video_transceiver = pc.addTransceiver("video", direction="recvonly")
        if options.codec is not None:
            video_transceiver.setCodecPreferences(codec_preferences(options.codec))
        for transceiver in pc.getTransceivers():  # measure the server, not aiortc's 80 ms audio prefetch
            if transceiver.kind == "audio" and receive_audio_packets(transceiver.receiver, received_audio):
                continue
            tune_receiver_latency(transceiver.receiver, video=options.video_release == "marker")
            if transceiver.kind == "video" and options.lose_keyframe_at_s is not None:
                losing = KeyframeLosingJitterBuffer(video.lost_keyframe_at)
                setattr(transceiver.receiver, JITTER_BUFFER_ATTRIBUTE, losing)
                tasks.append(
                    asyncio.create_task(lose_keyframe(transceiver.receiver, options.lose_keyframe_at_s))
                )
            jitter_buffer = getattr(transceiver.receiver, JITTER_BUFFER_ATTRIBUTE, None)
            if transceiver.kind == "video" and isinstance(jitter_buffer, MarkerJitterBuffer):
                jitter_buffer.give_ups, jitter_buffer.keyframes_at = video.give_ups, video.keyframes_at
        channel = pc.createDataChannel(META_CHANNEL_LABEL)

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            if isinstance(message, str):
                meta.append((time.monotonic(), parse_meta(message)))

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "video":
                tasks.append(asyncio.create_task(record_video(track, video, region[0])))
            else:
                tasks.append(asyncio.create_task(record_audio(track, received_audio)))

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState == "connected":
                connected.set()

        await pc.setLocalDescription(await pc.createOffer())
        body = {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}
        if avatar:
            body["avatar"] = avatar
        if options.size:
            body["size"] = options.size
        async with http.post(f"{base_url}/offer", json=body) as response:
            answer = await response.json(content_type=None)
            if response.status != 200:
                raise ProbeError(f"offer refused: {response.status} {answer.get('error', answer)}")
        region[0] = output_region(answer)
        recording = CallRecording(answer["session_id"], answer["avatar"], source, video, received_audio, meta)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        if options.network is not None:
            net = options.network
            recording.network = impair_peer_connection(pc, net.impairment, net.direction, net.seed)
        try:
            await asyncio.wait_for(connected.wait(), connect_timeout_s)
        except TimeoutError as e:
            raise ProbeError(f"no connection within {connect_timeout_s:g} s") from e
        recording.connected_at = time.monotonic()
        await source.done.wait()
        await asyncio.sleep(tail_s)
        for transceiver in pc.getTransceivers():
            if transceiver.kind == "video":
                video.pts_offset = first_frame_offset(transceiver.receiver)
        return recording
    finally:
        if recording is not None:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.delete(f"{base_url}/sessions/{recording.session_id}"):
                    pass
        await pc.close()
        if recording is not None and recording.network is not None:
            recording.network.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if own_http:
            await http.close()
