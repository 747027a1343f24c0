"""The session's media clock and producer: one video frame and exactly one frame of audio per tick.

At tick ``k`` (due at ``start + k / fps``) the producer pulls one frame of the caller's audio from the jitter
buffer, feeds its 16 kHz version to the backend's featurizer, delays the 48 kHz audio by the featurizer's
lookahead (so the frame and its audio leave together) and submits the frame to the render engine. The
tick leaves ``render_budget_ms`` later through both outgoing tracks (:mod:`lipcast.streaming.tracks`); a frame
that is not rendered by then is replaced by the previous one, never waited for. Its picture is composed once,
by :attr:`AvatarStream.frames` (:mod:`lipcast.streaming.frames`), for every consumer of the session's video.

Idle: the avatar frame shown at tick ``k`` follows the avatar's idle loop (:func:`idle_frame_index`) whether
it speaks or not. At rest (the featurizer says its conditioning changes nothing, or the voice-activity flags
have been quiet for :data:`IDLE_AFTER_QUIET_FRAMES` ticks) nothing is rendered and the loop's frame leaves as
it is. Switches between the two crossfade: each tick carries ``mix``, the weight of the rendered patch over
the avatar frame, which moves by ``1 / crossfade_frames`` per tick (renders continue while it fades out).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import Featurizer, RenderedPatch, RenderItem
from lipcast.pipeline.defaults import RENDER_BUDGET_MS
from lipcast.pipeline.timing import FPS, MEDIA_SAMPLE_RATE_HZ
from lipcast.pipeline.windows import FrameGrid
from lipcast.streaming.audio_buffer import InputAudioBuffer
from lipcast.streaming.clock import Clock, FrameTimeline
from lipcast.streaming.delay import Delayed, DelayLine
from lipcast.streaming.frames import SharedFrames
from lipcast.streaming.resample import DECIMATOR_DELAY_48K, FACTOR, Decimator
from lipcast.streaming.tasks import cancel_and_wait, session_log
from lipcast.streaming.tick import Tick

logger = logging.getLogger(__name__)

INT16_SCALE = 32768.0
CROSSFADE_FRAMES = 3  # idle <-> speaking switches blend over this many frames (120 ms at 25 fps)
IDLE_AFTER_QUIET_FRAMES = 2  # ticks without voice activity (the VAD holds 200 ms itself) before idling


class Renderer(Protocol):
    """What the producer needs of the render engine."""

    def submit(
        self, session_id: str, item: RenderItem, deadline_s: float | None = None
    ) -> Future[RenderedPatch]:
        """``deadline_s`` is on the stream's clock (the engine must share it): unrendered by then, drop."""
        ...

    def cancel_session(self, session_id: str) -> int: ...


@dataclass
class StreamStats:
    ticks: int = 0
    rendered: int = 0
    at_rest: int = 0
    render_errors: int = 0
    producer_late_ticks: int = 0  # ticks produced after their due time + one frame (event loop stalls)
    interrupts: int = 0


def idle_frame_index(tick: int, frame_count: int) -> int:
    """Ping-pong through the avatar's frames (0, 1, ..., n-1, n-2, ..., 1, 0, 1, ...)."""
    if frame_count <= 1:
        return 0
    period = 2 * (frame_count - 1)
    phase = tick % period
    return phase if phase < frame_count else period - phase


class AvatarStream:
    """Produces the session's ticks on its media clock and keeps the last ``capacity`` for the tracks."""

    def __init__(
        self,
        session_id: str,
        avatar: Avatar,
        featurizer: Featurizer,
        renderer: Renderer,
        audio_in: InputAudioBuffer,
        clock: Clock,
        *,
        fps: int = FPS,
        render_budget_ms: float = RENDER_BUDGET_MS,
        capacity_ms: float = 2000.0,
        crossfade_frames: int = CROSSFADE_FRAMES,
        perf_counter: Callable[[], float] = time.perf_counter,
        new_featurizer: Callable[[], Featurizer] | None = None,
        enhance_strength: float = 0.0,
    ) -> None:
        """``new_featurizer`` makes a fresh featurizer for :meth:`interrupt` (its windows forgotten).
        ``enhance_strength``: the session's face post-processing weight, sent with every frame (0: off)."""
        self.session_id = session_id
        self.avatar = avatar
        self.featurizer = featurizer
        self.renderer = renderer
        self.enhance_strength = enhance_strength
        self.audio_in = audio_in
        self.clock = clock
        self.grid = FrameGrid(fps)
        self.render_budget_s = render_budget_ms / 1000.0
        self.samples_per_tick = MEDIA_SAMPLE_RATE_HZ // fps
        self.capacity = max(2, round(capacity_ms / self.grid.frame_ms))
        self.stats = StreamStats()
        self.timeline: FrameTimeline | None = None
        self.frames = SharedFrames(avatar, fps, perf_counter=perf_counter)  # one composite per tick, shared
        self.started = asyncio.Event()
        self._perf = perf_counter
        self._new_featurizer = new_featurizer
        self._decimator = Decimator()
        self._delay = DelayLine(featurizer.lookahead_samples * FACTOR + DECIMATOR_DELAY_48K)
        self._ticks: dict[int, Tick] = {}
        self._produced = asyncio.Condition()
        self._next_index = 0
        self._task: asyncio.Task[None] | None = None
        self.closed = False
        self.error: Exception | None = None  # why the producer stopped on its own, if it did
        self.on_failure: Callable[[Exception], None] | None = None  # told once, after the stream closed
        self.log = session_log(logger, session_id)
        self._mix_step = 1.0 / max(1, crossfade_frames)
        self._mix = 0.0  # weight of rendered frames now: 0 idle, 1 speaking
        self._quiet_ticks = IDLE_AFTER_QUIET_FRAMES  # ticks since the last voice activity
        self._hushed = False  # interrupted and no new audio pulled since

    @property
    def delay_ms(self) -> float:
        """The fixed audio delay this stream adds on top of the jitter buffer: lookahead + decimator."""
        return self._delay.delay_samples * 1000.0 / MEDIA_SAMPLE_RATE_HZ

    @property
    def latest_index(self) -> int:
        return self._next_index - 1

    def present_time(self, index: int) -> float:
        """When tick ``index`` leaves through the tracks."""
        if self.timeline is None:
            raise RuntimeError("stream not started")
        return self.timeline.due(index) + self.render_budget_s

    def start(self) -> None:
        if self._task is None:
            self.timeline = FrameTimeline(self.clock.now(), self.grid.fps)
            self._task = asyncio.create_task(self._run(), name=f"avatar-stream-{self.session_id}")
            self.started.set()

    async def _close(self) -> None:
        """Mark the stream closed and wake every consumer: their ``get()`` returns None (end of stream)."""
        self.closed = True
        self.started.set()  # release tracks still waiting for a start that will not come
        async with self._produced:
            self._produced.notify_all()

    async def stop(self) -> None:
        await self._close()
        await cancel_and_wait(self._task)
        self._task = None
        self.renderer.cancel_session(self.session_id)
        for tick in self._ticks.values():
            if tick.patch is not None:
                tick.patch.cancel()
        self._ticks.clear()
        self.frames.clear()

    def interrupt(self) -> int:
        """Barge-in: drop every stage's queued audio and put the mouth at rest from the next tick that leaves.

        Empties the input buffer, the decimator's and featurizer's history and the delay line, cancels the
        session's queued renders in the engine, and turns every tick produced but not yet due to leave into
        silence at rest (no crossfade). Returns how many such unsent ticks were silenced.
        """
        self.audio_in.interrupt()
        self._decimator = Decimator()
        if self._new_featurizer is not None:
            self.featurizer = self._new_featurizer()
        self._delay = DelayLine(self._delay.delay_samples)
        self.renderer.cancel_session(self.session_id)
        self._mix = 0.0
        self._quiet_ticks = IDLE_AFTER_QUIET_FRAMES
        self._hushed = True  # at rest, whatever the featurizer says, until new audio arrives
        self.stats.interrupts += 1
        silenced = 0
        if self.timeline is None:
            return 0
        now = self.clock.now()
        for index, tick in self._ticks.items():
            if self.present_time(index) <= now:
                continue  # already left (or leaving now)
            if tick.patch is not None:
                tick.patch.cancel()
                tick.patch = None
            tick.audio = np.zeros_like(tick.audio)
            tick.input_pos = None
            tick.speech = False
            tick.mix = 1.0
            silenced += 1
        return silenced

    async def get(self, index: int) -> Tick | None:
        """Tick ``index``, waiting until it is produced; None if discarded or the stream closed."""
        async with self._produced:
            await self._produced.wait_for(lambda: self._next_index > index or self.closed)
        return None if self.closed else self._ticks.get(index)

    async def _run(self) -> None:
        """Produce ticks until stopped. A failure ends the stream (consumers see its end) and is logged once
        here; ``on_failure`` then lets the owner end the session."""
        assert self.timeline is not None
        index = self._next_index
        try:
            while True:
                index = self._next_index
                due_s = self.timeline.due(index)
                await self.clock.sleep_until(due_s)
                if self.clock.now() > due_s + self.timeline.frame_s:
                    self.stats.producer_late_ticks += 1
                tick = self.produce(index)
                async with self._produced:
                    self._ticks[index] = tick
                    self._ticks.pop(index - self.capacity, None)
                    self._next_index = index + 1
                    self._produced.notify_all()
        except Exception as e:
            self.error = e
            self.log.exception("producing tick %d failed; the stream ends", index)
        finally:
            await self._close()
        if self.error is not None and self.on_failure is not None:
            self.on_failure(self.error)

    def produce(self, index: int) -> Tick:
        """Build tick ``index`` from the next frame of inbound audio (synchronous, cheap)."""
        t0 = self._perf()
        pulled = self.audio_in.pull(self.samples_per_tick)
        if pulled.input_pos is None:
            positions = np.full(self.samples_per_tick, -1, np.int64)
        else:
            positions = np.arange(pulled.input_pos, pulled.input_pos + self.samples_per_tick)
        hop = self._decimator.process(pulled.samples.astype(np.float32) / INT16_SCALE)
        conditioning = self.featurizer.push(hop)
        out = self._delay.process(
            Delayed(pulled.samples, positions, np.full(self.samples_per_tick, pulled.speech))
        )
        featurize_ms = (self._perf() - t0) * 1000.0
        frame_index = idle_frame_index(index, self.avatar.frame_count)
        valid = out.positions[out.positions >= 0]
        tick = Tick(
            index=index,
            frame_index=frame_index,
            audio=out.samples,
            input_pos=int(valid[0] - (np.argmax(out.positions >= 0))) if len(valid) else None,
            speech=bool(out.speech.any()),
            conditioning=conditioning,
            patch=None,
            produced_s=self.clock.now(),
            featurize_ms=featurize_ms,
            buffer_ms=pulled.waited_ms,
        )
        if self.timeline is not None:
            tick.late_ms = max(0.0, (tick.produced_s - self.timeline.due(index)) * 1000.0)
        self.stats.ticks += 1
        voiced = pulled.speech or tick.speech  # the newest audio (lookahead) or this tick's own
        self._quiet_ticks = 0 if voiced else self._quiet_ticks + 1
        if pulled.input_pos is not None:
            self._hushed = False
        at_rest = self._hushed or self.featurizer.is_at_rest(
            conditioning, self._quiet_ticks < IDLE_AFTER_QUIET_FRAMES
        )
        step = -self._mix_step if at_rest else self._mix_step
        self._mix = min(1.0, max(0.0, self._mix + step))
        if self._mix == 0.0:
            self.stats.at_rest += 1
            return tick
        tick.mix = self._mix
        submitted = self._perf()
        future = self.renderer.submit(
            self.session_id,
            RenderItem(self.avatar.name, frame_index, conditioning, self.enhance_strength),
            deadline_s=self.present_time(index),
        )
        self.stats.rendered += 1

        def _done(f: Future[RenderedPatch], tick: Tick = tick) -> None:
            tick.render_ms = (self._perf() - submitted) * 1000.0

        future.add_done_callback(_done)
        tick.patch = future
        return tick
