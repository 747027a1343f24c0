"""lipcast's VP8 encoder inside aiortc's senders, the yuv420p frames it is given, and audio encoded on the
event loop."""

from __future__ import annotations

import asyncio
import fractions

import aiortc.rtcrtpsender
import av
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCRtpCodecParameters
from aiortc.codecs.vpx import Vp8Encoder as AiortcVp8Encoder
from aiortc.codecs.vpx import vp8_depayload
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, load_avatar
from lipcast.streaming import rtc
from lipcast.streaming.encoders import Vp8Encoder, Vp8Settings
from lipcast.streaming.frames import to_yuv420p
from lipcast.streaming.memory import keep_frame_buffers_in_heap

VP8 = RTCRtpCodecParameters(mimeType="video/VP8", clockRate=90000, payloadType=96)
OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2, payloadType=111)


def swscale_yuv420p(image: np.ndarray) -> np.ndarray:
    return av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p").to_ndarray()


@pytest.mark.parametrize("height, width", [(16, 16), (64, 48), (240, 320)])
def test_yuv420p_planes_are_swscales_to_within_one(height: int, width: int) -> None:
    """Luma and chroma as aiortc's own conversion made them (chroma filtered, not point-sampled)."""
    rng = np.random.default_rng(height)
    for _ in range(3):
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        difference = np.abs(to_yuv420p(image).astype(int) - swscale_yuv420p(image).astype(int))
        assert difference.max() <= 1


def test_the_avatars_planes_are_swscales_and_point_sampled_chroma_is_not() -> None:
    import cv2

    image = load_avatar(BUILTIN_AVATAR_DIR / "astronaut").frames[0]
    reference = swscale_yuv420p(image).astype(int)
    assert np.abs(to_yuv420p(image).astype(int) - reference).max() <= 1
    point_sampled = cv2.cvtColor(image, cv2.COLOR_RGB2YUV_I420).astype(int)  # the earlier attempt's
    assert np.abs(point_sampled - reference).max() > 8


def frame_of(image: np.ndarray, index: int, pixel_format: str) -> av.VideoFrame:
    if pixel_format == "yuv420p":
        frame = av.VideoFrame.from_ndarray(to_yuv420p(image), format="yuv420p")
    else:
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
    frame.pts = index * 3600
    frame.time_base = fractions.Fraction(1, 90000)
    return frame


@pytest.mark.parametrize("pixel_format", ["yuv420p", "rgb24"])
def test_vp8_encoder_decodes_to_the_picture_and_forces_keyframes(pixel_format: str) -> None:
    image = load_avatar(BUILTIN_AVATAR_DIR / "astronaut").frames[0]
    encoder = Vp8Encoder(Vp8Settings(cpu_used=-8, noise_sensitivity=0))
    decoder = av.CodecContext.create("libvpx", "r")
    timestamps = []
    for index in range(6):
        payloads, timestamp = encoder.encode(frame_of(image, index, pixel_format), force_keyframe=index == 4)
        timestamps.append(timestamp)
        data = b"".join(vp8_depayload(p) for p in payloads)
        (decoded,) = decoder.decode(av.Packet(data))
        keyframe = bool(data[0] & 1) is False  # VP8: bit 0 of the first byte clear on a keyframe
        assert keyframe == (index in (0, 4)), index
        error = np.abs(decoded.to_ndarray(format="rgb24").astype(int) - image.astype(int)).mean()
        assert error < 10.0  # the picture (at aiortc's 500 kbps start), not another one
    assert timestamps == [i * 3600 for i in range(6)]
    assert encoder.settings == Vp8Settings(-8, 0)
    assert encoder.opened == 1  # a clean link: the asked-for keyframe comes from the same codec


def test_a_keyframe_asked_for_on_a_lossy_link_comes_capped() -> None:
    image = load_avatar(BUILTIN_AVATAR_DIR / "astronaut").frames[0]
    encoder = Vp8Encoder()
    encoder.encode(frame_of(image, 0, "yuv420p"))
    encoder.on_loss(0.11)  # heavy loss reported; the bitrate moves by 5.5 %: no reopen for that
    encoder.encode(frame_of(image, 1, "yuv420p"))
    assert encoder.opened == 1
    # The PLI's keyframe comes from the codec reopened with capped keyframes; the next one needs no reopen.
    encoder.encode(frame_of(image, 2, "yuv420p"), force_keyframe=True)
    assert encoder.opened == 2 and encoder._keyframes_capped
    encoder.encode(frame_of(image, 3, "yuv420p"), force_keyframe=True)
    assert encoder.opened == 2


def test_vp8_encoder_reopens_when_the_receivers_bitrate_moves() -> None:
    image = np.zeros((32, 32, 3), np.uint8)
    encoder = Vp8Encoder()
    encoder.encode(frame_of(image, 0, "yuv420p"))
    encoder.target_bitrate = int(encoder.target_bitrate * 1.05)  # REMB, within 10 %: kept
    encoder.encode(frame_of(image, 1, "yuv420p"))
    assert encoder.opened == 1
    encoder.target_bitrate = encoder.target_bitrate * 2
    encoder.encode(frame_of(image, 2, "yuv420p"))
    assert encoder.opened == 2 and encoder.codec.bit_rate == encoder.target_bitrate


@pytest.mark.parametrize("changes", [{"cpu_used": -17}, {"cpu_used": 17}, {"noise_sensitivity": 7}])
def test_vp8_settings_are_checked(changes: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match="VP8"):
        Vp8Settings(**changes)


def test_senders_get_lipcasts_vp8_encoder_and_it_is_still_timed() -> None:
    seen: list[tuple[str, float]] = []
    rtc.use_vp8_settings(Vp8Settings(cpu_used=-10))
    stop = rtc.observe_encoding(lambda kind, seconds: seen.append((kind, seconds)))
    try:
        video = aiortc.rtcrtpsender.get_encoder(VP8)
        assert isinstance(video._inner, Vp8Encoder) and video.settings.cpu_used == -10
        video.encode(frame_of(np.zeros((32, 32, 3), np.uint8), 0, "yuv420p"))
        assert [kind for kind, _ in seen] == ["video"]
        rtc.use_vp8_settings(None)  # aiortc's own again
        assert type(aiortc.rtcrtpsender.get_encoder(VP8)._inner) is AiortcVp8Encoder
        assert not isinstance(aiortc.rtcrtpsender.get_encoder(OPUS)._inner, Vp8Encoder)
    finally:
        stop()
        rtc.use_vp8_settings(Vp8Settings())  # what create_app sets; later tests build apps anyway


async def test_audio_senders_encode_on_the_loop_and_video_senders_in_the_executor() -> None:
    pc = RTCPeerConnection()
    try:
        audio = pc.addTrack(AudioStreamTrack())
        video = pc.addTrack(VideoStreamTrack())
        assert rtc.encode_audio_on_loop(audio) and rtc.encode_audio_on_loop(audio)  # once is enough
        assert not rtc.encode_audio_on_loop(video)
        inline = audio._RTCRtpSender__loop  # type: ignore[attr-defined]
        assert isinstance(inline, rtc._InlineExecutorLoop)
        assert isinstance(video._RTCRtpSender__loop, asyncio.AbstractEventLoop)  # type: ignore[attr-defined]
        # What aiortc's sender does with it: the call runs now, on this thread, its result already there.
        import threading

        future = inline.run_in_executor(None, lambda: threading.current_thread().name)
        assert future.done() and await future == threading.current_thread().name
        failing = inline.run_in_executor(None, lambda: 1 // 0)
        with pytest.raises(ZeroDivisionError):
            await failing
        assert inline.time is not None and inline.is_running()  # the rest is the real loop's
    finally:
        await pc.close()


def test_frame_buffers_stay_in_the_heap_with_glibc() -> None:
    import platform

    assert keep_frame_buffers_in_heap() == (platform.libc_ver()[0] == "glibc")


def test_the_size_steps_down_on_a_narrow_link_before_the_picture_falls_apart() -> None:
    from lipcast.streaming.encoders import MIN_BITRATE_BPS, stepped_scale

    assert stepped_scale(320, 320, MIN_BITRATE_BPS, 1) == 1  # the default avatar never steps down
    assert stepped_scale(1280, 720, 300_000, 1) == 2  # 0.013 bits a pixel: 640x360
    assert stepped_scale(1920, 1080, 150_000, 1) == 4  # 480x270
    assert stepped_scale(1280, 720, 500_000, 2) == 2  # above the floor, not 1.5 x above it: stays
    assert stepped_scale(1280, 720, 800_000, 2) == 1
    assert stepped_scale(320, 320, 10_000, 1) == 2 and stepped_scale(320, 320, 1_000, 2) == 2  # >= 160 a side
    image = np.zeros((720, 1280, 3), np.uint8)
    encoder = Vp8Encoder()
    encoder.encode(frame_of(image, 0, "yuv420p"))
    assert (encoder.codec.width, encoder.codec.height) == (1280, 720)
    encoder.target_bitrate = 300_000  # the receiver's estimate falls
    payloads, _ = encoder.encode(frame_of(image, 1, "yuv420p"))
    assert (encoder.codec.width, encoder.codec.height) == (640, 360) and payloads
    encoder.target_bitrate = 2_000_000
    encoder.encode(frame_of(image, 2, "yuv420p"))
    assert (encoder.codec.width, encoder.codec.height) == (1280, 720) and encoder.scale == 1
