"""lipcast's VP8 settings, for the caller's encoder (inside aiortc's sender) and the viewers' shared one.

aiortc's ``Vp8Encoder`` is made for camera pictures: libvpx's temporal denoiser on (``noise-sensitivity``
4) and every frame converted from whatever it is to yuv420p with swscale inside the encoder. lipcast's
pictures are rendered, not filmed (no sensor noise to remove), and leave the compositor already as yuv420p
(:meth:`lipcast.streaming.frames.ComposedFrame.video_frame`). Measured on the built-in avatar's composed
frames (``benchmarks/vp8_settings.py``: 320x320, 301 frames of speech, one thread, CBR 1.5 Mbps, two runs):
the encode took 0.76-1.03 ms a frame with the denoiser and 0.61-0.62 ms without it, at the same picture
(PSNR-Y 42.4-42.5 vs 42.3 dB, SSIM-Y 0.985 both); ``cpu-used`` from -6 to -16 changed the time by no more than
the runs' noise (0.68-0.96 ms) and cost up to 1.9 dB PSNR-Y at -16, so -6, aiortc's, stays the default and
:class:`Vp8Settings` lets a deployment change both.

:class:`Vp8Encoder` keeps everything else of aiortc's: its rate control settings, the bitrate that follows
the receiver's REMB (the codec is reopened when it moves by more than 10 %), forced keyframes and its RTP
packetizer. :func:`lipcast.streaming.rtc.use_vp8_settings` makes aiortc's senders use it.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from typing import Any

import av
from aiortc.codecs import vpx
from aiortc.mediastreams import VIDEO_TIME_BASE, convert_timebase
from av import VideoFrame
from av.frame import Frame

# aiortc's 250 kbps floor does not fit a 300 kbps link with the voice beside it; 320x320 at 25 fps still
# holds together at 80 kbps.
MIN_BITRATE_BPS = 80_000
MAX_INTRA_RATE_PERCENT = 300  # libvpx's rc_max_intra_bitrate_pct, below NARROW_LINK_BPS
NARROW_LINK_BPS = 300_000  # the receiver's estimate or the loss says the link is this narrow
MAX_BITRATE_BPS = vpx.MAX_BITRATE
AIORTC_CPU_USED = -6  # aiortc's own value: negative = real-time mode, larger magnitude = faster
AIORTC_NOISE_SENSITIVITY = 4  # aiortc's own value (for cameras)
DEFAULT_NOISE_SENSITIVITY = 0  # rendered pictures have no sensor noise: the denoiser only costs time
CPU_USED_RANGE = (-16, 16)
NOISE_SENSITIVITY_RANGE = (0, 6)


@dataclass(frozen=True)
class Vp8Settings:
    cpu_used: int = AIORTC_CPU_USED
    noise_sensitivity: int = DEFAULT_NOISE_SENSITIVITY

    def __post_init__(self) -> None:
        low, high = CPU_USED_RANGE
        if not low <= self.cpu_used <= high:
            raise ValueError(f"VP8 cpu-used must be {low}..{high}, got {self.cpu_used}")
        low, high = NOISE_SENSITIVITY_RANGE
        if not low <= self.noise_sensitivity <= high:
            raise ValueError(f"VP8 noise sensitivity must be {low}..{high}, got {self.noise_sensitivity}")


def open_vp8(
    width: int, height: int, bitrate_bps: int, settings: Vp8Settings, *, cap_keyframes: bool = False
) -> Any:
    """A libvpx encoder with aiortc's real-time CBR settings but ``settings``' speed and denoiser;
    ``cap_keyframes``: keyframes at most :data:`MAX_INTRA_RATE_PERCENT` of an average frame (always below
    :data:`NARROW_LINK_BPS`)."""
    codec: Any = av.CodecContext.create("libvpx", "w")
    codec.width = width
    codec.height = height
    codec.bit_rate = bitrate_bps
    codec.pix_fmt = "yuv420p"
    codec.gop_size = 3000  # keyframes on request only, as aiortc
    codec.qmin = 2
    codec.qmax = 56
    codec.options = {
        "bufsize": str(bitrate_bps),
        "cpu-used": str(settings.cpu_used),
        "deadline": "realtime",
        "lag-in-frames": "0",
        "minrate": str(bitrate_bps),
        "maxrate": str(bitrate_bps),
        "noise-sensitivity": str(settings.noise_sensitivity),
        "overshoot-pct": "15",
        "partitions": "0",
        "static-thresh": "1",
        "undershoot-pct": "100",
    }
    if cap_keyframes or bitrate_bps < NARROW_LINK_BPS:
        # A keyframe (one a PLI asked for) at most 3x an average frame: a bigger one overruns a narrow link's
        # queue, loses packets and is asked for again, and the picture never comes back. Not for a call's
        # first keyframe on a link not known to be narrow: capped, it starts the picture blurred and it
        # sharpens over the next second.
        codec.options = {**codec.options, "max-intra-rate": str(MAX_INTRA_RATE_PERCENT)}
    codec.thread_count = vpx.number_of_threads(width * height, multiprocessing.cpu_count())
    return codec


class Vp8Encoder(vpx.Vp8Encoder):
    """aiortc's VP8 encoder (bitrate from REMB, keyframes on request, its packetizer) with lipcast's
    settings; a yuv420p frame is encoded as it is, any other format is converted first, as aiortc does."""

    def __init__(self, settings: Vp8Settings | None = None) -> None:
        super().__init__()
        self.settings = settings or Vp8Settings()
        self.opened = 0  # codecs opened: the first frame, a new size, a bitrate change > 10 %
        self._remb_bps = vpx.DEFAULT_BITRATE  # the receiver's estimate (REMB)
        self._loss_cap_bps = MAX_BITRATE_BPS  # what the reported loss allows
        self._keyframes_capped = False  # the open codec's keyframes are capped (max-intra-rate)

    @property
    def target_bitrate(self) -> int:
        """The lower of the receiver's estimate (REMB) and what the reported loss allows."""
        return min(self._remb_bps, self._loss_cap_bps)

    @target_bitrate.setter
    def target_bitrate(self, bitrate: int) -> None:
        self._remb_bps = max(MIN_BITRATE_BPS, min(int(bitrate), MAX_BITRATE_BPS))

    @property
    def lossy(self) -> bool:
        """A receiver reported heavy loss (over 10 %) in this call: the link is narrower than the rate."""
        return self._loss_cap_bps < MAX_BITRATE_BPS

    def on_loss(self, fraction_lost: float) -> None:
        """A receiver report's fraction lost (0..1), about once a second: above 10 % the bitrate backs off
        by half the loss, below 2 % it creeps back up by 8 % a report (GCC's loss-based controller)."""
        if fraction_lost > 0.10:
            self._loss_cap_bps = max(MIN_BITRATE_BPS, int(self.target_bitrate * (1 - 0.5 * fraction_lost)))
        elif fraction_lost < 0.02:
            self._loss_cap_bps = min(MAX_BITRATE_BPS, int(self._loss_cap_bps * 1.08))

    def encode(self, frame: Frame, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        assert isinstance(frame, VideoFrame)
        if frame.format.name != "yuv420p":
            frame = frame.reformat(format="yuv420p")
        codec: Any = self.codec
        if codec is not None and (
            frame.width != codec.width
            or frame.height != codec.height
            or abs(self.target_bitrate - codec.bit_rate) / codec.bit_rate > 0.1
            # A keyframe asked for (PLI: the receiver lost one) on a lossy link from a codec with uncapped
            # keyframes: reopened capped, which makes that keyframe. An uncapped one on a narrow link
            # overruns its queue, is lost again and asked for again, and the picture never comes back. (Not
            # on a clean link: receivers ask for keyframes at the start too, and a capped one starts the
            # picture blurred.)
            or (force_keyframe and self.lossy and not self._keyframes_capped)
        ):
            codec = None
        if codec is None:
            # Keyframes capped only on a link known to be narrow or lossy: a capped keyframe on a clean one
            # (the first, or one after the estimate moved) starts the picture blurred.
            self._keyframes_capped = self.lossy or self.target_bitrate < NARROW_LINK_BPS
            codec = self.codec = open_vp8(
                frame.width,
                frame.height,
                self.target_bitrate,
                self.settings,
                cap_keyframes=self._keyframes_capped,
            )
            self.opened += 1
        # The frame is the sender's own (each consumer wraps the shared picture in a frame of its own).
        frame.pict_type = av.video.frame.PictureType.I if force_keyframe else av.video.frame.PictureType.NONE
        data = b"".join(bytes(p) for p in codec.encode(frame))
        payloads = self._packetize(data, self.picture_id)
        assert frame.pts is not None and frame.time_base is not None  # set by every lipcast track
        timestamp = convert_timebase(frame.pts, frame.time_base, VIDEO_TIME_BASE)
        self.picture_id = (self.picture_id + 1) % (1 << 15)
        return payloads, timestamp
