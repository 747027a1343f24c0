"""Opus through libopus: decoding with loss concealment (its own PLC and in-band FEC, 48 kHz mono out), and
the outbound encoder whose bitrate follows the link (:class:`OpusEncoder`).

PyAV's decoder (FFmpeg's ``libopus`` wrapper, which aiortc uses) reaches neither: FFmpeg never hands libopus
an empty packet (PLC) and has no FEC switch. :class:`OpusDecoder` calls libopus through ``opuslib_next`` (a
ctypes binding; it needs the system's libopus, Debian's ``libopus0``): a packet decodes as usual, a lost one
is rebuilt from the next packet's in-band FEC data where the encoder put some (:func:`has_lbrr`), else by
libopus's packet-loss concealment. Without libopus on the system it falls back to PyAV for decoding and a
20 ms fade of the last audio for concealment (:attr:`OpusDecoder.backend` says which).

libopus downmixes a stereo stream when the decoder is made with one channel, so no resampler follows.
"""

from __future__ import annotations

import logging
from fractions import Fraction
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ, OPUS_PACKET_SAMPLES

logger = logging.getLogger(__name__)

Int16Array = npt.NDArray[np.int16]
MAX_FRAME_SAMPLES = 5760  # 120 ms at 48 kHz: the longest Opus packet
SAMPLES_PER_2_5_MS = MEDIA_SAMPLE_RATE_HZ // 400  # Opus frame sizes are multiples of 2.5 ms
LIBOPUS = "libopus"  # libopus through opuslib_next: PLC and FEC
PYAV_FADE = "pyav+fade"  # PyAV decodes; a lost packet becomes a fade of the last audio

try:  # the binding loads the system's libopus when imported
    import opuslib_next

    _LIBOPUS_ERROR: str | None = None
except Exception as e:  # noqa: BLE001 -- any failure to load a shared library means: not available
    opuslib_next = None
    _LIBOPUS_ERROR = f"{type(e).__name__}: {e}"


def libopus_available() -> bool:
    return opuslib_next is not None


def toc_mode(packet: bytes) -> str:
    """The Opus mode of a packet from its TOC byte (RFC 6716 section 3.1): silk, hybrid or celt."""
    config = packet[0] >> 3
    return "silk" if config < 12 else "hybrid" if config < 16 else "celt"


class _RangeDecoder:
    """The first bits of an Opus range-coded frame (RFC 6716 section 4.1): enough for SILK's header flags."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.rem = self._byte()
        self.rng = 128
        self.val = 127 - (self.rem >> 1)
        self._normalize()

    def _byte(self) -> int:
        value = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return value

    def _normalize(self) -> None:
        while self.rng <= 1 << 23:
            self.rng <<= 8
            sym = self.rem
            self.rem = self._byte()
            sym = ((sym << 8) | self.rem) >> 1
            self.val = ((self.val << 8) + (255 & ~sym)) & ((1 << 31) - 1)

    def bit_logp(self, logp: int) -> bool:
        s = self.rng >> logp
        bit = self.val < s
        if bit:
            self.rng = s
        else:
            self.val -= s
            self.rng -= s
        self._normalize()
        return bit


def has_lbrr(packet: bytes) -> bool:
    """Whether a one-frame SILK or hybrid packet carries in-band FEC (LBRR) for the packet before it.

    SILK's frame header opens with one voice-activity flag per SILK frame and then the LBRR flag, for the
    mid channel first (RFC 6716 section 4.2.3); that flag is what this reads. CELT-only packets carry none.
    Packets of several frames (TOC code 1-3) are read at their first frame."""
    if len(packet) < 2 or toc_mode(packet) == "celt":
        return False
    config, code = packet[0] >> 3, packet[0] & 0x3
    if code not in (0, 1):  # code 1: two frames of equal size, the first right after the TOC byte
        return False
    data = packet[1:]
    frame_ms = (10, 20, 40, 60)[config % 4] if config < 12 else (10, 20)[config % 2]
    silk_frames = max(1, frame_ms // 20)
    decoder = _RangeDecoder(data)
    for _ in range(silk_frames):
        decoder.bit_logp(1)  # VAD flags
    return decoder.bit_logp(1)


class OpusDecoder:
    """One inbound stream's decoder: :meth:`decode` a packet, :meth:`conceal` or :meth:`recover` a loss."""

    def __init__(self) -> None:
        self._last: Int16Array = np.zeros(0, np.int16)
        self._faded = False
        self._pyav: Any = None
        self._libopus: Any = None
        if opuslib_next is not None:
            self._libopus = opuslib_next.Decoder(MEDIA_SAMPLE_RATE_HZ, 1)
            self.backend = LIBOPUS
        else:
            from av import CodecContext

            logger.warning("libopus not loadable (%s): lost audio packets become a fade", _LIBOPUS_ERROR)
            self._pyav = CodecContext.create("libopus", "r")
            self._pyav.format = "s16"
            self._pyav.layout = "mono"
            self._pyav.sample_rate = MEDIA_SAMPLE_RATE_HZ
            self.backend = PYAV_FADE

    def decode(self, packet: bytes) -> Int16Array:
        if self._libopus is not None:
            pcm = self._libopus.decode(packet, MAX_FRAME_SAMPLES)
            out = np.frombuffer(pcm, np.int16).copy()
        else:
            out = self._decode_pyav(packet)
        self._last, self._faded = out, False
        return out

    def conceal(self, samples: int) -> Int16Array:
        """``samples`` (a multiple of 2.5 ms) of audio for a packet that never came."""
        samples = _whole_2_5_ms(samples)
        if self._libopus is not None:
            return np.frombuffer(self._libopus.decode(b"", samples), np.int16).copy()
        return self._fade(samples)

    def recover(self, next_packet: bytes, samples: int) -> Int16Array:
        """The lost packet before ``next_packet``, from its in-band FEC data (PLC where it has none)."""
        samples = _whole_2_5_ms(samples)
        if self._libopus is not None:
            return np.frombuffer(self._libopus.decode(next_packet, samples, True), np.int16).copy()
        return self._fade(samples)

    def _decode_pyav(self, packet: bytes) -> Int16Array:
        from av.packet import Packet

        av_packet = Packet(packet)
        av_packet.time_base = Fraction(1, MEDIA_SAMPLE_RATE_HZ)
        frames = self._pyav.decode(av_packet)
        if not frames:
            return np.zeros(0, np.int16)
        return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16)

    def _fade(self, samples: int) -> Int16Array:
        """The last audio's tail, faded to silence over one block; silence after that."""
        out = np.zeros(samples, np.int16)
        if not self._faded and len(self._last):
            tail = np.resize(self._last[-samples:], samples).astype(np.float32)
            out = (tail * np.linspace(1.0, 0.0, samples, dtype=np.float32)).astype(np.int16)
        self._faded = True
        return out


def _whole_2_5_ms(samples: int) -> int:
    return max(SAMPLES_PER_2_5_MS, samples - samples % SAMPLES_PER_2_5_MS)


# Outbound voice: aiortc's 96 kbps where the link has room; on a narrow one (the receiver's estimate for the
# call's video below NARROW_AUDIO_BELOW_BPS and not climbing for NARROW_AUDIO_AFTER_S: a clean link's
# estimate starts near 320 kbps and climbs 4 % a report, a 300 kbps link's stays at 200-250 kbps) 32 kbps,
# back up once the estimate clears WIDE_AUDIO_ABOVE_BPS. 32 kbps mono with FEC still carries wideband
# speech; at 96 kbps the voice was a third of a 300 kbps link.
DEFAULT_OUTBOUND_BITRATE_BPS = 96_000
_OPUS_TIME_BASE = Fraction(1, MEDIA_SAMPLE_RATE_HZ)
NARROW_LINK_AUDIO_BITRATE_BPS = 32_000
NARROW_AUDIO_BELOW_BPS = 400_000
NARROW_AUDIO_AFTER_S = 2.0
WIDE_AUDIO_ABOVE_BPS = 900_000


def outbound_audio_bitrate(current_bps: int, video_estimate_bps: int, low_for_s: float) -> int:
    """The voice's bitrate once the receiver estimates ``video_estimate_bps`` for the call's video, which
    has been below NARROW_AUDIO_BELOW_BPS for ``low_for_s``."""
    if video_estimate_bps < NARROW_AUDIO_BELOW_BPS and low_for_s >= NARROW_AUDIO_AFTER_S:
        return NARROW_LINK_AUDIO_BITRATE_BPS
    if video_estimate_bps > WIDE_AUDIO_ABOVE_BPS:
        return DEFAULT_OUTBOUND_BITRATE_BPS
    return current_bps


class OpusEncoder:
    """Outbound Opus through libopus (``opuslib_next``), in aiortc's encoder interface: 20 ms packets, in-band
    FEC when asked, and a bitrate that can change mid-call (:attr:`target_bitrate`), which PyAV's encoder
    (aiortc's) cannot without reopening its codec and restarting its timestamps.

    Frames of any layout and rate are resampled to 48 kHz mono in 20 ms frames, as aiortc's encoder does."""

    def __init__(self, *, fec_loss_percent: int | None = None) -> None:
        if opuslib_next is None:
            raise RuntimeError(f"libopus is not loadable: {_LIBOPUS_ERROR}")
        from av import AudioResampler

        self._encoder = opuslib_next.Encoder(MEDIA_SAMPLE_RATE_HZ, 1, "voip")
        self._encoder.bitrate = DEFAULT_OUTBOUND_BITRATE_BPS
        if fec_loss_percent is not None:
            self._encoder.inband_fec = 1
            self._encoder.packet_loss_perc = fec_loss_percent
        self._bitrate_bps = DEFAULT_OUTBOUND_BITRATE_BPS
        self._resampler = AudioResampler(
            format="s16", layout="mono", rate=MEDIA_SAMPLE_RATE_HZ, frame_size=OPUS_PACKET_SAMPLES
        )
        self._samples = 0  # encoded so far: the RTP timestamp of the next packet (48 kHz)

    @property
    def target_bitrate(self) -> int:
        return self._bitrate_bps

    @target_bitrate.setter
    def target_bitrate(self, bitrate_bps: int) -> None:
        if bitrate_bps != self._bitrate_bps:
            self._encoder.bitrate = bitrate_bps
            self._bitrate_bps = bitrate_bps

    def encode(self, frame: Any, force_keyframe: bool = False) -> tuple[list[bytes], int | None]:
        payloads: list[bytes] = []
        timestamp = self._samples
        for out in self._resampler.resample(frame):
            pcm = out.to_ndarray().reshape(-1).astype(np.int16, copy=False)
            payloads.append(self._encoder.encode(pcm.tobytes(), len(pcm)))
            self._samples += len(pcm)
        return (payloads, timestamp) if payloads else ([], None)

    def pack(self, packet: Any) -> tuple[list[bytes], int]:
        """An Opus packet encoded elsewhere (a viewer's, from the session's shared encoder), as it is: its
        RTP timestamp from its pts (aiortc's ``OpusEncoder.pack``)."""
        from aiortc.mediastreams import convert_timebase

        return [bytes(packet)], convert_timebase(packet.pts, packet.time_base, _OPUS_TIME_BASE)


class AdaptiveOpusEncoder:
    """The outbound voice: aiortc's encoder (PyAV's libopus, FEC on) while the link has room, and from the
    first time the receiver's estimate asks for another bitrate on, :class:`OpusEncoder` (the system's
    libopus, whose bitrate can change), continuing the same RTP clock. (The system's libopus, Debian's 1.3,
    encodes the voice a little worse than PyAV's bundled one: the probe found 97.9 % of a clean call's audio
    blocks again against 100 %, so it is used only where the bitrate must move.)"""

    def __init__(self, inner: Any, *, fec_loss_percent: int | None = None) -> None:
        self._inner = inner
        self._fec_loss_percent = fec_loss_percent
        self._libopus: OpusEncoder | None = None
        self._bitrate_bps = DEFAULT_OUTBOUND_BITRATE_BPS
        self._next_timestamp = 0  # of the packet after the last one out (48 kHz)
        self._low_since_s: float | None = None  # since when the estimate has been low and not climbing
        self._low_from_bps = 0  # the estimate then

    def follow(self, video_estimate_bps: int, now_s: float) -> None:
        """A receiver estimate for the call's video came at ``now_s`` (seconds, any monotonic clock)."""
        if video_estimate_bps >= NARROW_AUDIO_BELOW_BPS:
            self._low_since_s = None
        elif self._low_since_s is None or video_estimate_bps > self._low_from_bps * 1.1:
            # A clean link's estimate also starts low (~320 kbps), but it climbs: the clock starts again.
            self._low_since_s, self._low_from_bps = now_s, video_estimate_bps
        low_for_s = 0.0 if self._low_since_s is None else now_s - self._low_since_s
        self.target_bitrate = outbound_audio_bitrate(self.target_bitrate, video_estimate_bps, low_for_s)

    @property
    def target_bitrate(self) -> int:
        return self._bitrate_bps

    @target_bitrate.setter
    def target_bitrate(self, bitrate_bps: int) -> None:
        if bitrate_bps == self._bitrate_bps:
            return
        if self._libopus is None:
            if not libopus_available():
                return  # aiortc's encoder keeps its 96 kbps
            self._libopus = OpusEncoder(fec_loss_percent=self._fec_loss_percent)
            self._libopus._samples = self._next_timestamp
        self._libopus.target_bitrate = bitrate_bps
        self._bitrate_bps = bitrate_bps

    def encode(self, frame: Any, force_keyframe: bool = False) -> tuple[list[bytes], int | None]:
        encoder: Any = self._libopus if self._libopus is not None else self._inner
        payloads, timestamp = encoder.encode(frame, force_keyframe)
        if payloads and timestamp is not None:
            self._next_timestamp = timestamp + OPUS_PACKET_SAMPLES * len(payloads)
        return payloads, timestamp

    def pack(self, packet: Any) -> tuple[list[bytes], int]:
        return cast(tuple[list[bytes], int], self._inner.pack(packet))
