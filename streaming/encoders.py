"""lipcast's VP8 and H.264 settings, for the caller's encoder (inside aiortc's sender) and the viewers'
shared one.

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

import fractions
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import av
from aiortc.codecs import h264, vpx
from aiortc.mediastreams import VIDEO_TIME_BASE, convert_timebase
from av import VideoFrame
from av.frame import Frame

# aiortc's 250 kbps floor does not fit a 300 kbps link with the voice beside it; 320x320 at 25 fps still
# holds together at 80 kbps.
MIN_BITRATE_BPS = 80_000
MAX_INTRA_RATE_PERCENT = 300  # libvpx's rc_max_intra_bitrate_pct, below NARROW_LINK_BPS
NARROW_LINK_BPS = 300_000  # the receiver's estimate or the loss says the link is this narrow
MAX_BITRATE_BPS = vpx.MAX_BITRATE  # the ceiling up to 320x320 (aiortc's); larger pictures get more
# Larger pictures: the ceiling grows with the pixels, 0.1 bit per pixel per frame (1280x720: 2.3 Mbps,
# 1920x1080: 5.2 Mbps at 25 fps), never below MAX_BITRATE_BPS.
BITS_PER_PIXEL_FRAME = 0.1
MAX_FRAME_RATE_HZ = 25
VIDEO_CODECS = ("vp8", "h264")  # lipcast's names, in the server's default order of preference
MIME_TYPES = {"vp8": "video/vp8", "h264": "video/h264"}
H264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium")
DEFAULT_H264_PRESET = "ultrafast"
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


def max_bitrate_bps(width: int, height: int) -> int:
    """The bitrate ceiling of a ``width`` x ``height`` stream (the receiver's estimate raises it so far)."""
    return max(MAX_BITRATE_BPS, round(BITS_PER_PIXEL_FRAME * width * height * MAX_FRAME_RATE_HZ))


def h264_level(width: int, height: int) -> str:
    """The lowest H.264 level whose frame size holds ``width`` x ``height`` at 25 fps (in macroblocks:
    3.0 up to 1620, e.g. 720x576; 3.1 up to 3600, 1280x720; 4.0 up to 8192, 1920x1080). aiortc always asks
    for 3.1, which cannot carry 1080p."""
    macroblocks = -(-width // 16) * -(-height // 16)
    if macroblocks <= 1620:
        return "3.0"
    if macroblocks <= 3600:
        return "3.1"
    return "4.0"


@dataclass(frozen=True)
class H264Settings:
    preset: str = DEFAULT_H264_PRESET

    def __post_init__(self) -> None:
        if self.preset not in H264_PRESETS:
            raise ValueError(f"H.264 preset must be one of {', '.join(H264_PRESETS)}, got {self.preset!r}")


def open_h264(width: int, height: int, bitrate_bps: int, settings: H264Settings) -> Any:
    """libx264 for real-time calls: constrained baseline (no B-frames, CAVLC: every browser decodes it),
    ``tune=zerolatency`` (no lookahead, no frame delay), the level for the size, one thread (a call is one
    core's work; many calls spread over the cores), CBR with a one-second buffer, keyframes on request."""
    codec: Any = av.CodecContext.create("libx264", "w")
    codec.width = width
    codec.height = height
    codec.bit_rate = bitrate_bps
    codec.pix_fmt = "yuv420p"
    codec.framerate = fractions.Fraction(MAX_FRAME_RATE_HZ, 1)
    codec.time_base = fractions.Fraction(1, MAX_FRAME_RATE_HZ)
    codec.gop_size = 3000  # keyframes on request only, as for VP8
    codec.profile = "Baseline"
    codec.thread_count = 1
    codec.options = {
        "preset": settings.preset,
        "tune": "zerolatency",
        "level": h264_level(width, height),
        "maxrate": str(bitrate_bps),
        "bufsize": str(bitrate_bps),
        "x264-params": "sliced-threads=0:repeat-headers=1",  # SPS/PPS on every keyframe (late joiners)
    }
    return codec


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
    # One thread a call (aiortc's gives a 720p picture 2-3 and 1080p 8): many calls encode in parallel on
    # the cores (media workers); threads of one encoder contend with the other calls' for the same cores.
    codec.thread_count = 1
    return codec


# Below this many bits per pixel per frame a picture falls apart into blocks: it is sent at half the width
# and height instead (each step halves both; back up once the rate allows 1.5 times the floor at the larger
# size). 320x320 at MIN_BITRATE_BPS is 0.031, so the default avatar never steps down; 1280x720 does below
# 460 kbps.
MIN_BITS_PER_PIXEL_FRAME = 0.02
STEP_UP_MARGIN = 1.5
MIN_STEPPED_SIDE_PX = 160  # never smaller than this a side


def bits_per_pixel_frame(bitrate_bps: int, width: int, height: int) -> float:
    return bitrate_bps / (width * height * MAX_FRAME_RATE_HZ)


def stepped_scale(width: int, height: int, bitrate_bps: int, scale: int) -> int:
    """The divisor (1, 2, 4, ...) of a ``width`` x ``height`` picture at ``bitrate_bps``, from the current
    ``scale``: down a step while the rate is below the floor, up a step while it allows STEP_UP_MARGIN times
    the floor at the larger size."""
    while (
        min(width, height) // (scale * 2) >= MIN_STEPPED_SIDE_PX
        and bits_per_pixel_frame(bitrate_bps, width // scale, height // scale) < MIN_BITS_PER_PIXEL_FRAME
    ):
        scale *= 2
    while scale > 1:
        larger = scale // 2
        floor = MIN_BITS_PER_PIXEL_FRAME * STEP_UP_MARGIN
        if bits_per_pixel_frame(bitrate_bps, width // larger, height // larger) < floor:
            break
        scale = larger
    return scale


class RateFollower:
    """The bitrate of a caller's encoder: the receiver's estimate (REMB) within the picture size's ceiling
    (:func:`max_bitrate_bps`) and what the reported loss allows (GCC's loss-based controller); on a link too
    narrow for the picture's size, the size steps down (:func:`stepped_scale`) before the picture falls apart.
    """

    def _init_rate(self, start_bps: int) -> None:
        self.scale = 1  # the picture is sent at 1 / scale of its width and height
        self._ceiling_bps = MAX_BITRATE_BPS  # raised on the first frame of a larger picture
        self._remb_bps = start_bps  # the receiver's estimate (REMB)
        self._loss_cap_bps = MAX_BITRATE_BPS * 100  # what the reported loss allows

    def _follow_size(self, width: int, height: int) -> None:
        ceiling = max_bitrate_bps(width, height)
        if ceiling != self._ceiling_bps:
            # Start a larger picture as high above the floor as the small one would be.
            self._remb_bps = round(self._remb_bps * ceiling / self._ceiling_bps)
            self._ceiling_bps = ceiling

    def _prepared(self, frame: VideoFrame) -> VideoFrame:
        """``frame`` as yuv420p at the size the rate allows; the size's bitrate ceiling followed."""
        if frame.format.name != "yuv420p":
            frame = frame.reformat(format="yuv420p")
        self._follow_size(frame.width, frame.height)
        return self._stepped(frame)

    def _outdated(self, codec: Any, frame: VideoFrame) -> bool:
        """The open codec no longer fits: another size, or a target more than 10 % from its bitrate."""
        return bool(
            frame.width != codec.width
            or frame.height != codec.height
            or abs(self.target_bitrate - codec.bit_rate) / codec.bit_rate > 0.1
        )

    def _stepped(self, frame: VideoFrame) -> VideoFrame:
        """``frame`` at the size the rate allows (itself while that is its own)."""
        self.scale = stepped_scale(frame.width, frame.height, self.target_bitrate, self.scale)
        if self.scale == 1:
            return frame
        width, height = frame.width // self.scale & ~1, frame.height // self.scale & ~1
        stepped = frame.reformat(width=width, height=height, format="yuv420p")
        stepped.pts, stepped.time_base = frame.pts, frame.time_base
        return stepped

    @property
    def target_bitrate(self) -> int:
        """The lowest of the receiver's estimate, the size's ceiling and what the reported loss allows."""
        return max(MIN_BITRATE_BPS, min(self._remb_bps, self._ceiling_bps, self._loss_cap_bps))

    @target_bitrate.setter
    def target_bitrate(self, bitrate: int) -> None:
        self._remb_bps = max(MIN_BITRATE_BPS, int(bitrate))

    @property
    def lossy(self) -> bool:
        """A receiver reported heavy loss (over 10 %) in this call: the link is narrower than the rate."""
        return self._loss_cap_bps < self._ceiling_bps

    def on_loss(self, fraction_lost: float) -> None:
        """A receiver report's fraction lost (0..1), about once a second: above 10 % the bitrate backs off
        by half the loss, below 2 % it creeps back up by 8 % a report (GCC's loss-based controller)."""
        if fraction_lost > 0.10:
            self._loss_cap_bps = max(MIN_BITRATE_BPS, int(self.target_bitrate * (1 - 0.5 * fraction_lost)))
        elif fraction_lost < 0.02:
            self._loss_cap_bps = min(MAX_BITRATE_BPS * 100, int(self._loss_cap_bps * 1.08))


class Vp8Encoder(RateFollower, vpx.Vp8Encoder):
    """aiortc's VP8 encoder (bitrate from REMB, keyframes on request, its packetizer) with lipcast's
    settings; a yuv420p frame is encoded as it is, any other format is converted first, as aiortc does."""

    def __init__(self, settings: Vp8Settings | None = None) -> None:
        super().__init__()
        self.settings = settings or Vp8Settings()
        self.opened = 0  # codecs opened: the first frame, a new size, a bitrate change > 10 %
        self._init_rate(vpx.DEFAULT_BITRATE)
        self._keyframes_capped = False  # the open codec's keyframes are capped (max-intra-rate)

    def encode(self, frame: Frame, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        assert isinstance(frame, VideoFrame)
        frame = self._prepared(frame)
        codec: Any = self.codec
        if codec is not None and (
            self._outdated(codec, frame)
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


class H264Encoder(RateFollower, h264.H264Encoder):
    """aiortc's H.264 encoder (its packetizer: STAP-A and FU-A, packetization-mode 1; keyframes on request)
    with :func:`open_h264`'s settings, and the bitrate as for VP8 (REMB within the size's ceiling, backing
    off on loss)."""

    def __init__(self, settings: H264Settings | None = None) -> None:
        super().__init__()
        self.settings = settings or H264Settings()
        self.opened = 0
        self._init_rate(vpx.DEFAULT_BITRATE)

    def _encode_frame(self, frame: VideoFrame, force_keyframe: bool) -> Iterator[bytes]:
        frame = self._prepared(frame)
        codec: Any = self.codec
        if codec is not None and self._outdated(codec, frame):
            codec = None
        if codec is None:
            codec = self.codec = open_h264(frame.width, frame.height, self.target_bitrate, self.settings)
            self.opened += 1
            force_keyframe = True  # a reopened codec starts with one anyway; the receiver needs SPS/PPS
        frame.pict_type = av.video.frame.PictureType.I if force_keyframe else av.video.frame.PictureType.NONE
        data = b"".join(bytes(p) for p in codec.encode(frame))
        if data:
            yield from self._split_bitstream(data)
