from __future__ import annotations

import asyncio
from concurrent.futures import Future

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.engine import RenderEngine
from lipcast.streaming.audio_buffer import InputAudioBuffer
from lipcast.streaming.avatar_stream import AvatarStream, idle_frame_index
from lipcast.streaming.frames import to_yuv420p
from lipcast.streaming.resample import DECIMATOR_DELAY_48K
from lipcast.streaming.tracks import AvatarAudioTrack, AvatarVideoTrack
from tests.fakes import FakeBackend, FakeClock, LevelFeaturizer, speech_pattern, tiny_avatar, to_int16

TICK = 1920


class ManualRenderer:
    """A renderer whose futures the test completes by hand."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, RenderItem, Future[RenderedPatch]]] = []
        self.cancelled: list[str] = []

    def submit(
        self, session_id: str, item: RenderItem, deadline_s: float | None = None
    ) -> Future[RenderedPatch]:
        future: Future[RenderedPatch] = Future()
        self.submitted.append((session_id, item, future))
        return future

    def cancel_session(self, session_id: str) -> int:
        self.cancelled.append(session_id)
        return 0


def make_stream(renderer, lookahead_samples: int = 0, frames: int = 1, clock=None, crossfade_frames: int = 1):
    clock = clock or FakeClock()
    buffer = InputAudioBuffer(48_000, target_ms=40)
    stream = AvatarStream(
        "s1",
        tiny_avatar(frames=frames),
        LevelFeaturizer(lookahead_samples),
        renderer,
        buffer,
        clock,
        render_budget_ms=40,
        crossfade_frames=crossfade_frames,
    )
    return stream, buffer, clock


async def collect(track, count: int) -> list:
    return [await track.recv() for _ in range(count)]


def test_idle_frame_index_ping_pongs() -> None:
    assert [idle_frame_index(k, 3) for k in range(7)] == [0, 1, 2, 1, 0, 1, 2]
    assert [idle_frame_index(k, 1) for k in range(3)] == [0, 0, 0]


async def test_audio_leaves_in_order_delayed_by_exactly_the_lookahead() -> None:
    lookahead = 320  # 20 ms at 16 kHz
    stream, buffer, clock = make_stream(ManualRenderer(), lookahead_samples=lookahead)
    audio = to_int16(speech_pattern([("speech", 0.6), ("silence", 0.2)]))
    for i in range(0, len(audio), 960):
        buffer.push(audio[i : i + 960], speech=True)
    stream.start()
    track = AvatarAudioTrack(stream)
    task = asyncio.create_task(collect(track, 40))
    await clock.advance(20 * 0.04 + 0.1)
    frames = await task
    out = np.concatenate([f.to_ndarray().reshape(-1)[::2] for f in frames])
    assert [f.samples for f in frames] == [960] * 40  # one Opus packet per frame
    assert [f.pts for f in frames] == [k * 960 for k in range(40)]
    delay = lookahead * 3 + DECIMATOR_DELAY_48K
    assert stream.delay_ms == pytest.approx(delay / 48)
    np.testing.assert_array_equal(out[:delay], 0)
    np.testing.assert_array_equal(out[delay:], audio[: len(out) - delay])
    await stream.stop()


async def test_frames_at_rest_are_not_rendered() -> None:
    backend = FakeBackend()
    engine = RenderEngine(backend, (1, 2, 4))
    engine.add_avatar(tiny_avatar())
    engine.start()
    try:
        stream, buffer, clock = make_stream(engine)
        stream.start()
        video = AvatarVideoTrack(stream)
        task = asyncio.create_task(collect(video, 5))
        await clock.advance(0.3)
        frames = await task
        assert backend.batches == []
        assert stream.stats.at_rest == stream.stats.ticks >= 5
        for frame in frames:
            # The avatar frame as it is, as the encoders take it (yuv420p, converted once per tick).
            np.testing.assert_array_equal(frame.to_ndarray(), to_yuv420p(stream.avatar.frames[0]))
    finally:
        engine.stop()


async def test_late_render_repeats_the_previous_frame_and_failure_shows_the_avatar() -> None:
    renderer = ManualRenderer()
    stream, buffer, clock = make_stream(renderer)
    loud = to_int16(speech_pattern([("speech", 0.5)]))
    for i in range(0, len(loud), 960):
        buffer.push(loud[i : i + 960], speech=True)
    base = stream.avatar.frames[0]
    patch = RenderedPatch(np.full((8, 8, 3), 200, np.uint8), 4, 4)
    stream.start()
    video = AvatarVideoTrack(stream)
    await clock.advance(0.001)  # tick 0 produced at the start
    renderer.submitted[0][2].set_result(patch)
    first = asyncio.create_task(video.recv())
    await clock.advance(0.04)  # tick 0 presented, tick 1 produced and never completed
    frame0 = (await first).to_ndarray()  # yuv420p planes
    composed = stream.frames._frames[0].image  # the picture they were converted from
    assert (composed[4:12, 4:12] == 200).all() and (composed[:4] == base[:4]).all()
    np.testing.assert_array_equal(frame0, to_yuv420p(composed))
    second = asyncio.create_task(video.recv())
    await clock.advance(0.04)  # tick 1 presented while its render is still running
    np.testing.assert_array_equal((await second).to_ndarray(), frame0)
    assert video.stats.late == 1
    renderer.submitted[2][2].set_exception(RuntimeError("render failed"))
    third = asyncio.create_task(video.recv())
    await clock.advance(0.04)
    np.testing.assert_array_equal((await third).to_ndarray(), to_yuv420p(base))
    assert video.stats.failed == 1 and video.stats.sent == 3
    await stream.stop()
    assert renderer.cancelled == ["s1"]
    assert renderer.submitted[1][2].cancelled()


async def test_tracks_end_when_the_stream_stops() -> None:
    stream, _, clock = make_stream(ManualRenderer())
    video, audio = AvatarVideoTrack(stream), AvatarAudioTrack(stream)
    pending = [asyncio.create_task(video.recv()), asyncio.create_task(audio.recv())]
    await asyncio.sleep(0)
    await stream.stop()
    for task in pending:
        with pytest.raises(MediaStreamError):
            await task


class BrokenFeaturizer(LevelFeaturizer):
    """Works for ``good_pushes`` hops, then raises."""

    def __init__(self, good_pushes: int) -> None:
        super().__init__()
        self.good_pushes = good_pushes

    def push(self, hop):  # type: ignore[no-untyped-def]
        if self.good_pushes <= 0:
            raise RuntimeError("featurizer broke")
        self.good_pushes -= 1
        return super().push(hop)


async def test_a_failing_producer_ends_the_stream_for_its_tracks_and_stop_completes() -> None:
    stream, buffer, clock = make_stream(ManualRenderer())
    stream.featurizer = BrokenFeaturizer(good_pushes=3)
    failures: list[Exception] = []
    stream.on_failure = failures.append
    video, audio = AvatarVideoTrack(stream), AvatarAudioTrack(stream)
    stream.start()
    video_task = asyncio.create_task(collect(video, 10))
    audio_task = asyncio.create_task(collect(audio, 20))
    await clock.advance(0.5)
    # Both tracks end (MediaStreamError) instead of waiting for a tick that never comes.
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(video_task, 1)
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(audio_task, 1)
    assert stream.closed and stream.stats.ticks == 3
    assert len(failures) == 1 and str(failures[0]) == "featurizer broke" and stream.error is failures[0]
    await stream.stop()  # does not raise what the producer already reported
    assert stream._task is None
