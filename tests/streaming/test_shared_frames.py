"""One composite per tick: every video track of a stream gets the same read-only picture for a tick."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lipcast.pipeline.backend import RenderedPatch
from lipcast.streaming.fanout import Vp8PacketEncoder
from lipcast.streaming.frames import KEEP_COMPOSED_FRAMES
from lipcast.streaming.tracks import AvatarVideoTrack
from tests.fakes import speech_pattern, to_int16
from tests.streaming.test_avatar_stream import ManualRenderer, make_stream


def speaking_stream(renderer: ManualRenderer):  # type: ignore[no-untyped-def]
    stream, buffer, clock = make_stream(renderer)
    loud = to_int16(speech_pattern([("speech", 1.0)]))
    for i in range(0, len(loud), 960):
        buffer.push(loud[i : i + 960], speech=True)
    return stream, clock


def patch(value: int) -> RenderedPatch:
    return RenderedPatch(np.full((8, 8, 3), value, np.uint8), 4, 4)


async def test_a_render_finishing_between_two_consumers_does_not_split_their_pictures() -> None:
    """The first consumer of a tick decides late or not; the others get its frame, not a composite of their
    own. (Composed per track, the caller would repeat the previous picture while the viewers show the new
    one.)"""
    renderer = ManualRenderer()
    stream, clock = speaking_stream(renderer)
    stream.start()
    caller, viewers, camera = (AvatarVideoTrack(stream) for _ in range(3))
    tracks = (caller, viewers, camera)
    await clock.advance(0.001)  # tick 0 produced
    renderer.submitted[0][2].set_result(patch(200))
    pending = [asyncio.create_task(t.recv()) for t in tracks]
    await clock.advance(0.04)  # tick 0 presented
    first = [await p for p in pending]
    assert first[0].format.name == "yuv420p"  # what the VP8 encoders take (streaming/frames.py)
    shown = first[0].to_ndarray()
    assert (stream.frames._frames[0].image[4:12, 4:12] == 200).all()  # the composed picture

    # Tick 1: the caller asks at its presentation time, while its render still runs ...
    pending = [asyncio.create_task(caller.recv())]
    await clock.advance(0.04)
    late = await pending[0]
    # ... which then finishes before the other two ask for the same tick.
    renderer.submitted[1][2].set_result(patch(90))
    others = [await viewers.recv(), await camera.recv()]
    for frame in (late, *others):
        assert frame.pts == 3600
        np.testing.assert_array_equal(frame.to_ndarray(), shown)  # the previous picture
    # One composite per tick, shared; each track's VideoFrame is its own (PyAV frames are not thread-safe).
    assert first[0] is not first[1]
    assert [t.stats.late for t in tracks] == [1, 1, 1]
    assert [t.stats.sent for t in tracks] == [2, 2, 2]
    stats = stream.frames.stats
    assert (stats.composed, stats.pasted, stats.shared) == (2, 1, 4)
    await stream.stop()


async def test_shared_frames_are_read_only_and_the_avatar_is_untouched() -> None:
    renderer = ManualRenderer()
    stream, clock = speaking_stream(renderer)
    before = stream.avatar.frames.copy()
    stream.start()
    track = AvatarVideoTrack(stream)
    await clock.advance(0.001)
    renderer.submitted[0][2].set_result(patch(255))
    pending = asyncio.create_task(track.next_frame())
    await clock.advance(0.04)
    frame = await pending
    assert not frame.image.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        frame.image[0, 0] = 0
    # The viewers' encoder reads the shared frame and writes only to its own conversion.
    encoder = Vp8PacketEncoder()
    for pixel_format in ("rgb24", "yuv420p"):
        video = frame.video_frame(pixel_format)
        packet, keyframe = encoder.encode(video, keyframe=True)
        assert packet is not None and keyframe
        assert video.format.name == pixel_format and video.pts == 0
        assert video.pict_type == frame.video_frame().pict_type  # the encoder marked only its own copy
    np.testing.assert_array_equal(frame.video_frame("rgb24").to_ndarray(format="rgb24"), frame.image)
    np.testing.assert_array_equal(frame.video_frame().to_ndarray(), frame.yuv420p())
    assert not frame.yuv420p().flags.writeable and frame.yuv420p() is frame.yuv420p()  # converted once
    np.testing.assert_array_equal(stream.avatar.frames, before)
    await stream.stop()


async def test_only_the_last_few_frames_are_kept() -> None:
    stream, clock = make_stream(ManualRenderer())[::2]
    stream.start()
    track = AvatarVideoTrack(stream)

    async def ten() -> list:  # type: ignore[type-arg]
        return [await track.next_frame() for _ in range(10)]

    task = asyncio.create_task(ten())
    await clock.advance(0.45)
    frames = await task
    assert [f.index for f in frames] == list(range(10))
    assert sorted(stream.frames._frames) == list(range(10 - KEEP_COMPOSED_FRAMES, 10))
    await stream.stop()
    assert stream.frames._frames == {}
