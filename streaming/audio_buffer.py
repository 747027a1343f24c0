"""The session's inbound audio buffer: a jitter buffer bounded in milliseconds.

Policy (audio is never reordered; speech is never dropped while the buffer is within its bound):

* The target depth is fixed (``target_ms``) or adaptive (``jitter`` given): then it starts at
  ``target_ms`` (the least that playout needs, one tick of audio) and follows the observed inter-arrival
  jitter (:class:`lipcast.streaming.jitter.JitterEstimator`: a high percentile of the blocks' relative delay,
  grown at once, shrunk slowly once the spike has left its window), between ``target_ms`` and
  ``max_target_ms``.
* The media clock pulls one frame of audio per tick. Playout starts once the target is buffered and
  restarts the same way after running dry; a dry tick gets silence (an *underrun*) and the late audio is
  played afterwards, in order.
* Network bursts or a client clock running fast leave the buffer deeper than its target. The excess is
  removed only where the voice-activity detector marked *silence*, whole 20 ms blocks at a time, so latency
  returns to the target at the next pause without cutting speech (*trimmed* audio).
* Adaptive only: depth counts whole blocks, but whether a tick finds its audio is a matter of time. Each
  pull records its *margin*: how long ago the block that completes the tick's audio arrived (concealed audio
  counts as arriving when the packet after it would have on time: its FEC comes with that one). Once a window
  of :data:`TRIM_WINDOW_PULLS` (5 s) pulls is recorded, the silent head blocks that fit in its smallest
  margin less a guard (:data:`TRIM_GUARD_MS`, plus what the jitter estimate still holds from an underrun or
  an older spike) are dropped, as many whole blocks as fit (none if the head is speech). The window's
  margins are then lowered by what was dropped (each of those pulls would have had that much less to spare),
  so later pulls go on trimming as the guard decays, rather than waiting for a new window: the depth follows
  a forgotten spike down within seconds. The window's
  minimum margin is its worst arrival, so a trim never leaves less time to spare than the last 5 s needed;
  with steady 20 ms packets and 40 ms ticks it takes the wait from 40-60 ms to 20-40 ms. The first trim of a
  call needs only :data:`FIRST_TRIM_WINDOW_PULLS` (1 s): a call's first audio often arrives bunched and
  primes playout blocks deeper than it needs, and that excess goes in one trim (dropping one block per
  window, as before, kept the second spare block for 5 s more).
* A lost packet concealed by PLC because the packet after it (whose in-band FEC rebuilds it) had not come
  yet (:meth:`InputAudioBuffer.observe_fec_missed`) deepens the buffer by one tick at once and keeps
  :data:`FEC_GUARD_MS` more in its target and its trim guard for :data:`FEC_GUARD_HOLD_S` after the last
  such loss: on a lossy link the next loss comes with its FEC at hand (20 ms more delay); on a clean one
  the guard lapses and the depth returns at the next pause.
* A tick that would find the buffer short first asks :attr:`InputAudioBuffer.refill` (the packet stage)
  for the missing audio, which conceals a lost packet then rather than let playout run dry.
* Above ``max_ms`` (a client sending far faster than real time) the oldest audio is discarded whatever it
  holds (*overflow*), so latency can never grow without bound. Each case is counted.

An underrun is logged (at most one line per :data:`UNDERRUN_LOG_INTERVAL_S`, with the count since the last
one) with what tells its cause apart: how long ago the newest audio arrived. A late arrival is the network,
the caller, or this process's event loop stalling (:mod:`lipcast.streaming.loop_stalls` logs it); audio that
kept arriving on time but still ran short is a target too shallow for the jitter.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ
from lipcast.streaming.jitter import JitterEstimator
from lipcast.streaming.tasks import session_log

logger = logging.getLogger(__name__)

TRIM_WINDOW_PULLS = 125  # ticks (5 s at 25 fps) of margins that must all allow a trim
FIRST_TRIM_WINDOW_PULLS = 25  # the first after playout began (1 s): a call's start often arrives bunched
TRIM_GUARD_MS = 5.0  # the least time to spare that a trim may leave
# On a lossy stream that carries in-band FEC, one packet more of depth (kept this long after the last loss
# that it would have saved) lets a lost packet be rebuilt from the next one instead of concealed by PLC.
FEC_GUARD_MS = 20.0
FEC_GUARD_HOLD_S = 10.0
UNDERRUN_LOG_INTERVAL_S = 5.0  # underruns after a logged one are counted into the next line

Int16Array = npt.NDArray[np.int16]


@dataclass
class _Block:
    samples: Int16Array
    speech: bool
    input_pos: int  # position of samples[0] in the client's stream, in samples
    arrived_s: float = 0.0  # on the buffer's clock
    concealed: bool = False  # made up for lost audio: its arrival says nothing of the network


@dataclass(frozen=True)
class Pulled:
    """One tick's audio. ``input_pos`` is the stream position of its first sample (None for filler)."""

    samples: Int16Array
    speech: bool
    input_pos: int | None
    underrun: bool
    waited_ms: float | None = None  # how long its first sample sat in the buffer (None for filler)


@dataclass
class BufferStats:
    pushed_samples: int = 0
    pulled_samples: int = 0
    underruns: int = 0
    trimmed_samples: int = 0
    overflow_samples: int = 0
    interrupted_samples: int = 0  # dropped on purpose by :meth:`InputAudioBuffer.interrupt`
    stretched_samples: int = 0  # played while holding the stream back, so the buffer could deepen


class InputAudioBuffer:
    """Mono int16 audio at ``sample_rate_hz``, pushed in blocks with a speech flag, pulled per tick."""

    def __init__(
        self,
        sample_rate_hz: int = MEDIA_SAMPLE_RATE_HZ,
        *,
        target_ms: float = 80.0,
        trim_hysteresis_ms: float | None = 40.0,
        max_ms: float = 1000.0,
        jitter: JitterEstimator | None = None,
        max_target_ms: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger] = logger,
    ) -> None:
        """``jitter`` None: a fixed ``target_ms``; else adaptive from ``target_ms`` up to ``max_target_ms``.
        ``clock`` (seconds) timestamps arrivals for the jitter estimate; ``log`` gets the underrun lines."""
        if not 0 < target_ms < max_ms or (jitter is not None and not target_ms <= max_target_ms < max_ms):
            raise ValueError("need 0 < target_ms <= max_target_ms < max_ms")
        self.sample_rate_hz = sample_rate_hz
        self.jitter = jitter
        self._base_target_samples = round(target_ms * sample_rate_hz / 1000)
        self._max_target_samples = round(max_target_ms * sample_rate_hz / 1000)
        # None: never trim silence (pushed audio: every sample is played)
        self._hysteresis_samples = (
            None if trim_hysteresis_ms is None else round(trim_hysteresis_ms * sample_rate_hz / 1000)
        )
        self.max_samples = round(max_ms * sample_rate_hz / 1000)
        self._clock = clock
        self.log = log
        self.stats = BufferStats()
        self._blocks: deque[_Block] = deque()
        self._depth = 0
        self._primed = False
        self._ever_primed = False
        self._next_input_pos = 0
        # Adaptive: how long ago, at each recent pull, the block completing the tick's audio arrived (s).
        self._margins_s: deque[float] = deque(maxlen=TRIM_WINDOW_PULLS)
        self._trim_window = FIRST_TRIM_WINDOW_PULLS  # pulls of margins the next trim needs
        self._last_arrival_s: float | None = None
        self._underruns_logged_s: float | None = None  # when the last underrun line was written
        self._underruns_unlogged = 0
        self._last_real: tuple[float, int] | None = None  # the newest block that arrived: (when, position)
        # Asked, before a tick is declared dry, to supply this many samples if it can (lost audio concealed).
        self.refill: Callable[[int], None] | None = None
        # Asked for this many samples that continue the audio without taking any of the stream (concealment
        # that holds the stream back a tick): how the buffer deepens once audio starts arriving late.
        self.stretch: Callable[[int], Int16Array] | None = None
        self._late_pending = False  # audio arrived too late to play since the last pull
        self._fec_guard_until_s: float | None = None  # adaptive: keep FEC_GUARD_MS more until then
        self._fec_hold_pending = False  # a loss missed its FEC since the last pull: deepen by FEC_GUARD_MS
        self._last_speech = False

    @property
    def target_samples(self) -> int:
        """The depth playout starts at (and trimming returns to)."""
        if self.jitter is None:
            return self._base_target_samples
        extra = round((self.jitter.jitter_ms + self.fec_guard_ms) * self.sample_rate_hz / 1000)
        return min(self._max_target_samples, self._base_target_samples + extra)

    @property
    def fec_guard_ms(self) -> float:
        """What the target keeps for FEC on a lossy stream now (0 once the last such loss is old)."""
        until = self._fec_guard_until_s
        return FEC_GUARD_MS if until is not None and self._clock() < until else 0.0

    @property
    def target_ms(self) -> float:
        return self.target_samples * 1000.0 / self.sample_rate_hz

    @property
    def trim_above_samples(self) -> int | None:
        """The depth above which silence is trimmed (None: never)."""
        if self._hysteresis_samples is None:
            return None
        return self.target_samples + self._hysteresis_samples

    @property
    def depth_samples(self) -> int:
        return self._depth

    @property
    def depth_ms(self) -> float:
        return self._depth * 1000.0 / self.sample_rate_hz

    @property
    def clock(self) -> Callable[[], float]:
        """The clock arrivals are on (seconds)."""
        return self._clock

    @property
    def stream_position(self) -> int:
        """Where the next pushed sample sits in the caller's stream (samples pushed so far)."""
        return self._next_input_pos

    def observe_late(self, arrived_s: float, position: int) -> None:
        """Audio at ``position`` came at ``arrived_s``, too late to play: the jitter estimate counts it, and
        the next pull holds the stream back a tick if the buffer is below its (new) target."""
        if self.jitter is not None:
            self.jitter.observe(arrived_s, position / self.sample_rate_hz)
        self._late_pending = True

    def observe_fec_missed(self) -> None:
        """A lost packet was concealed before the packet carrying its FEC came: keep one packet more (the
        next pull holds the stream back a tick if the buffer is below its target). Adaptive only."""
        if self.jitter is None:
            return
        self._fec_guard_until_s = self._clock() + FEC_GUARD_HOLD_S
        self._fec_hold_pending = True

    def push(
        self, samples: Int16Array, speech: bool, *, arrived_s: float | None = None, concealed: bool = False
    ) -> None:
        """Append a block of the client's audio (in stream order).

        ``arrived_s``: when its packet arrived, on :attr:`clock` (None: now); a packet held back behind a
        missing one is pushed later than it arrived. ``concealed``: audio made up for a lost packet, which
        says nothing of the network's timing, so it does not feed the jitter estimate (loss is not jitter).
        """
        if len(samples) == 0:
            return
        now = self._clock() if arrived_s is None else arrived_s
        if concealed and self._last_real is not None:
            # When the audio of a lost packet can be had: the next packet (its FEC) on time, one block late.
            last_s, last_pos = self._last_real
            now = last_s + (self._next_input_pos - last_pos + len(samples)) / self.sample_rate_hz
        if self.jitter is not None and not concealed:
            position_s = self._next_input_pos / self.sample_rate_hz
            self.jitter.observe(now, position_s)
        if not concealed:
            self._last_real = (now, self._next_input_pos)
        self._last_arrival_s = now
        self._blocks.append(_Block(samples, speech, self._next_input_pos, now, concealed))
        self._next_input_pos += len(samples)
        self._depth += len(samples)
        self.stats.pushed_samples += len(samples)
        if self._depth > self.max_samples:
            dropped = self._discard_oldest(self._depth - self.max_samples, silence_only=False)
            self.stats.overflow_samples += dropped
            logger.warning(
                "inbound audio over its %d-sample bound: dropped %d samples", self.max_samples, dropped
            )

    def flush(self, tick_samples: int) -> int:
        """End of an utterance: pad with silence to whole ticks and play out even below the target.

        Returns the silence samples added.
        """
        if self._depth == 0:
            return 0
        pad = -self._depth % tick_samples
        if pad:
            self.push(np.zeros(pad, np.int16), False)
        self._primed = self._ever_primed = True
        return pad

    def interrupt(self) -> int:
        """Drop everything queued (barge-in); the next audio primes playout afresh. Returns the count."""
        dropped = self._depth
        self._blocks.clear()
        self._depth = 0
        self._primed = False
        self._margins_s.clear()
        self.stats.interrupted_samples += dropped
        return dropped

    def pull(self, count: int) -> Pulled:
        """Take ``count`` samples for one tick (silence when not primed or dry)."""
        if not self._primed:
            if self._depth >= max(self.target_samples, count):
                self._primed = self._ever_primed = True
            else:
                return Pulled(np.zeros(count, np.int16), False, None, underrun=False)
        late, self._late_pending = self._late_pending, False
        fec_hold, self._fec_hold_pending = self._fec_hold_pending, False
        if late and self.stretch is not None and self._depth < self.target_samples:
            return self._hold(count, self.stretch)
        if fec_hold and self.stretch is not None and self._depth < self.target_samples:
            return self._hold(count, self.stretch)
        if self._depth < count and self.refill is not None:
            self.refill(count - self._depth)
        if self._depth < count:
            self._primed = False
            self.stats.underruns += 1
            self._margins_s.clear()
            self._trim_window = TRIM_WINDOW_PULLS
            if self.jitter is not None:
                self.jitter.underrun()
            self._log_underrun(count)
            return Pulled(np.zeros(count, np.int16), False, None, underrun=True)
        if self.jitter is not None:
            self._margins_s.append(self._margin_s(count))
        pulled = self._take(count)
        self._last_speech = pulled.speech
        target = self.target_samples
        excess = self._depth - target
        if self._hysteresis_samples is not None and excess > self._hysteresis_samples:
            self.stats.trimmed_samples += self._discard_oldest(excess, silence_only=True)
        if self.jitter is not None and self._hysteresis_samples is not None:
            self._trim_by_margin(self.jitter)
        return pulled

    def _hold(self, count: int, stretch: Callable[[int], Int16Array]) -> Pulled:
        """Play a tick of concealment that continues the audio and take nothing: the stream is held back a
        tick, so later audio that arrives as late as the last did is in time (NetEQ's "expand"). The excess
        this leaves once the network calms goes as silence, by the margin trim."""
        samples = stretch(count)
        if len(samples) != count:
            samples = np.resize(samples, count) if len(samples) else np.zeros(count, np.int16)
        self.stats.stretched_samples += count
        return Pulled(samples.astype(np.int16, copy=False), self._last_speech, None, underrun=False)

    def _log_underrun(self, count: int) -> None:
        now = self._clock()
        if self._underruns_logged_s is not None and now - self._underruns_logged_s < UNDERRUN_LOG_INTERVAL_S:
            self._underruns_unlogged += 1
            return
        unlogged = self._underruns_unlogged
        since = f" (and {unlogged} more since the last line)" if unlogged else ""
        arrived = (
            "none has arrived yet"
            if self._last_arrival_s is None
            else f"the newest arrived {(now - self._last_arrival_s) * 1000.0:.0f} ms ago"
        )
        self.log.info(
            "inbound audio ran dry%s: %.0f of the tick's %.0f ms queued, %s; target now %.0f ms",
            since,
            self.depth_ms,
            count * 1000.0 / self.sample_rate_hz,
            arrived,
            self.target_ms,
        )
        self._underruns_logged_s = now
        self._underruns_unlogged = 0

    def _margin_s(self, count: int) -> float:
        """How long ago the block holding the ``count``-th queued sample arrived (depth >= count).

        While the FEC guard holds, what counts is the packet after it (which carries that block's FEC, were
        it lost): one packet later. A concealed block's arrival is already that packet's."""
        queued = 0
        guard_s = self.fec_guard_ms / 1000.0
        for block in self._blocks:
            queued += len(block.samples)
            if queued >= count:
                return self._clock() - block.arrived_s - (0.0 if block.concealed else guard_s)
        raise AssertionError("margin asked with less than count queued")

    def _trim_by_margin(self, jitter: JitterEstimator) -> None:
        """Drop the silent head blocks that every pull of the window could have spared."""
        if len(self._margins_s) < self._trim_window or not self._blocks or self._blocks[0].speech:
            return
        # The window's minimum already holds its worst arrival; what the estimator still holds above its
        # percentile (an underrun's allowance, a spike not yet forgotten) is kept as well.
        held_ms = max(0.0, jitter.jitter_ms - jitter.percentile_ms)
        spare_s = min(self._margins_s) - (TRIM_GUARD_MS + held_ms) / 1000.0
        dropped = self._discard_oldest(max(0, int(spare_s * self.sample_rate_hz)), silence_only=True)
        if dropped:
            self.stats.trimmed_samples += dropped
            # Every pull of the window would have had that much less to spare at the new depth: the window
            # stays, shifted, so the depth follows the guard down as an old spike is forgotten (not one
            # step per window).
            dropped_s = dropped / self.sample_rate_hz
            self._margins_s = deque((m - dropped_s for m in self._margins_s), maxlen=TRIM_WINDOW_PULLS)
            self._trim_window = TRIM_WINDOW_PULLS

    def _take(self, count: int) -> Pulled:
        out = np.empty(count, np.int16)
        filled = 0
        speech = False
        input_pos = self._blocks[0].input_pos
        waited_ms = (self._clock() - self._blocks[0].arrived_s) * 1000.0
        while filled < count:
            block = self._blocks[0]
            n = min(count - filled, len(block.samples))
            out[filled : filled + n] = block.samples[:n]
            speech |= block.speech
            filled += n
            if n == len(block.samples):
                self._blocks.popleft()
            else:
                block.samples = block.samples[n:]
                block.input_pos += n
        self._depth -= count
        self.stats.pulled_samples += count
        return Pulled(out, speech, input_pos, underrun=False, waited_ms=waited_ms)

    def _discard_oldest(self, limit: int, *, silence_only: bool) -> int:
        """Drop whole blocks from the head, up to ``limit`` samples; stop at speech if ``silence_only``."""
        dropped = 0
        while self._blocks:
            block = self._blocks[0]
            if silence_only and (block.speech or dropped + len(block.samples) > limit):
                break
            if not silence_only and dropped >= limit:
                break
            self._blocks.popleft()
            dropped += len(block.samples)
        self._depth -= dropped
        return dropped


ADAPTIVE_MAX_TARGET_MS = 300.0


def make_input_buffer(
    sample_rate_hz: int,
    fixed_target_ms: float | None,
    *,
    frame_ms: float,
    clock: Callable[[], float] = time.monotonic,
    session_id: str = "-",
) -> InputAudioBuffer:
    """A session's buffer: ``fixed_target_ms`` when given, else adaptive from one frame of audio (the
    least that playout of a tick needs) up to :data:`ADAPTIVE_MAX_TARGET_MS`. Its log lines carry
    ``session_id``."""
    log = session_log(logger, session_id)
    if fixed_target_ms is not None:
        return InputAudioBuffer(sample_rate_hz, target_ms=fixed_target_ms, clock=clock, log=log)
    return InputAudioBuffer(
        sample_rate_hz,
        target_ms=frame_ms,
        jitter=JitterEstimator(),
        max_target_ms=ADAPTIVE_MAX_TARGET_MS,
        clock=clock,
        log=log,
    )
