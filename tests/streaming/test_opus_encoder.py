"""The outbound Opus encoder (libopus): 20 ms packets on a continuous clock, FEC, a bitrate that moves
mid-call, and the voice following the receiver's estimate for the call's video (real aiortc senders)."""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest
from aiortc import RTCCertificate, RTCDtlsTransport, RTCIceGatherer, RTCIceTransport, RTCRtpSender
from aiortc.codecs.opus import OpusEncoder as AiortcOpusEncoder
from aiortc.rtp import RTCP_PSFB_APP, RtcpPsfbPacket, RtcpRrPacket, pack_remb_fci

from lipcast.streaming.opus import (
    DEFAULT_OUTBOUND_BITRATE_BPS,
    NARROW_AUDIO_AFTER_S,
    NARROW_LINK_AUDIO_BITRATE_BPS,
    AdaptiveOpusEncoder,
    OpusDecoder,
    OpusEncoder,
    has_lbrr,
    libopus_available,
    outbound_audio_bitrate,
)
from lipcast.streaming.rtc import use_congestion_control, video_estimate_bps
from lipcast.streaming.tracks import stereo_audio_frame

pytestmark = pytest.mark.skipif(
    not libopus_available(), reason="needs the system's libopus (Debian libopus0)"
)

PACKET = 960


def voice(packets: int) -> np.ndarray:
    t = np.arange(PACKET * packets) / 48000
    tone = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180, 360, 540, 1250, 2600), start=1))
    return (tone * 5000 * (1.2 + np.sin(2 * np.pi * 3 * t))).astype(np.int16)


def encode_all(encoder: OpusEncoder, samples: np.ndarray) -> list[tuple[list[bytes], int | None]]:
    frames = [stereo_audio_frame(samples[i : i + PACKET], i) for i in range(0, len(samples), PACKET)]
    return [encoder.encode(frame) for frame in frames]


def test_packets_are_20_ms_on_a_continuous_clock_and_decode() -> None:
    encoder = OpusEncoder()
    out = encode_all(encoder, voice(50))
    timestamps = [ts for payloads, ts in out if payloads]
    assert len(timestamps) >= 49 and np.all(np.diff(timestamps) == PACKET)
    decoder = OpusDecoder()
    decoded = np.concatenate([decoder.decode(p) for payloads, _ in out for p in payloads])
    assert len(decoded) == PACKET * len(timestamps) and np.abs(decoded).mean() > 500


def test_the_bitrate_moves_mid_call_and_fec_is_sent_when_asked() -> None:
    encoder = OpusEncoder(fec_loss_percent=10)
    samples = voice(100)
    wide = encode_all(encoder, samples[: 50 * PACKET])
    encoder.target_bitrate = NARROW_LINK_AUDIO_BITRATE_BPS
    narrow = encode_all(encoder, samples[50 * PACKET :])
    size = lambda out: np.mean([len(p) for payloads, _ in out[10:] for p in payloads])  # noqa: E731
    assert size(narrow) < 0.6 * size(wide)
    assert sum(has_lbrr(p) for payloads, _ in narrow for p in payloads) >= 10
    assert [ts for _, ts in narrow][0] == 50 * PACKET  # the clock goes on across the change
    assert not any(has_lbrr(p) for payloads, _ in encode_all(OpusEncoder(), samples) for p in payloads)


def test_the_voice_bitrate_follows_the_estimate_with_hysteresis() -> None:
    wide, narrow = DEFAULT_OUTBOUND_BITRATE_BPS, NARROW_LINK_AUDIO_BITRATE_BPS
    assert outbound_audio_bitrate(wide, 1_500_000, 0.0) == wide
    assert outbound_audio_bitrate(wide, 250_000, 0.5) == wide  # a clean link's first estimates are low too
    assert outbound_audio_bitrate(wide, 250_000, 2.0) == narrow
    assert outbound_audio_bitrate(narrow, 700_000, 0.0) == narrow  # between the two: stays
    assert outbound_audio_bitrate(wide, 700_000, 0.0) == wide
    assert outbound_audio_bitrate(narrow, 1_000_000, 0.0) == wide


async def test_a_remb_for_the_video_moves_the_voice_of_the_same_call() -> None:
    use_congestion_control()
    dtls = RTCDtlsTransport(RTCIceTransport(RTCIceGatherer()), [RTCCertificate.generateCertificate()])
    other = RTCDtlsTransport(RTCIceTransport(RTCIceGatherer()), [RTCCertificate.generateCertificate()])
    audio, video, elsewhere = (
        RTCRtpSender("audio", dtls),
        RTCRtpSender("video", dtls),
        RTCRtpSender("audio", other),
    )
    encoders = [AdaptiveOpusEncoder(AiortcOpusEncoder()), AdaptiveOpusEncoder(AiortcOpusEncoder())]
    for sender, encoder in ((audio, encoders[0]), (elsewhere, encoders[1])):
        sender._RTCRtpSender__encoder = encoder  # type: ignore[attr-defined]
        await sender._handle_rtcp_packet(RtcpRrPacket(ssrc=1, reports=[]))  # its receiver reports
    remb = pack_remb_fci(250_000, [video._ssrc])
    await video._handle_rtcp_packet(RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=1, media_ssrc=0, fci=remb))
    assert encoders[0].target_bitrate == DEFAULT_OUTBOUND_BITRATE_BPS  # low, but not for long yet
    encoders[0]._low_since_s = time.monotonic() - NARROW_AUDIO_AFTER_S  # as if 2 s of such estimates
    await video._handle_rtcp_packet(RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=1, media_ssrc=0, fci=remb))
    assert encoders[0].target_bitrate == NARROW_LINK_AUDIO_BITRATE_BPS
    assert encoders[1].target_bitrate == DEFAULT_OUTBOUND_BITRATE_BPS  # another call's link
    assert video_estimate_bps(video) == 250_000 and video_estimate_bps(audio) is None  # a viewer's, kept
    remb = pack_remb_fci(1_200_000, [video._ssrc])
    await video._handle_rtcp_packet(RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=1, media_ssrc=0, fci=remb))
    assert encoders[0].target_bitrate == DEFAULT_OUTBOUND_BITRATE_BPS


def test_a_packet_encoded_elsewhere_is_packed_as_it_is_at_its_pts() -> None:
    from av.packet import Packet

    packet = Packet(b"\x78\x01\x02")
    packet.pts, packet.time_base = 4800, Fraction(1, 48000)
    assert OpusEncoder().pack(packet) == ([b"\x78\x01\x02"], 4800)


def test_the_voice_moves_to_libopus_on_the_same_clock_when_its_bitrate_must_change() -> None:
    encoder = AdaptiveOpusEncoder(AiortcOpusEncoder(), fec_loss_percent=10)
    samples = voice(60)
    first = encode_all(encoder, samples[: 30 * PACKET])
    timestamps = [ts for payloads, ts in first if payloads]
    encoder.target_bitrate = NARROW_LINK_AUDIO_BITRATE_BPS
    then = encode_all(encoder, samples[30 * PACKET :])
    later = [ts for payloads, ts in then if payloads]
    assert later[0] == timestamps[-1] + PACKET and np.all(np.diff(later) == PACKET)
    size = lambda out: np.mean([len(p) for payloads, _ in out[10:] for p in payloads])  # noqa: E731
    assert size(then) < 0.6 * size(first)
