"""Pushed audio: conversion to 48 kHz, odd bytes, the bound, flush; the interrupt hooks of the buffer and
the stream."""

from __future__ import annotations

import numpy as np
import pytest

from lipcast.streaming.audio_buffer import InputAudioBuffer
from lipcast.streaming.push_audio import PushAudio, PushBufferFull
from lipcast.streaming.vad import SpeechDetector
from tests.fakes import speech_pattern, to_int16
from tests.streaming.test_avatar_stream import TICK, ManualRenderer, make_stream


def make_push(rate_hz: int = 16_000, max_buffer_s: float = 2.0) -> tuple[PushAudio, InputAudioBuffer]:
    buffer = InputAudioBuffer(
        48_000, target_ms=40, trim_hysteresis_ms=None, max_ms=max_buffer_s * 1000 + 1000
    )
    push = PushAudio(
        buffer, SpeechDetector(48_000), input_rate_hz=rate_hz, max_buffer_s=max_buffer_s, tick_samples=TICK
    )
    return push, buffer


def test_16_khz_becomes_48_khz_with_the_same_sound() -> None:
    push, buffer = make_push(16_000)
    tone = to_int16(0.3 * np.sin(2 * np.pi * 440 * np.arange(16_000) / 16_000).astype(np.float32))
    data = tone.astype("<i2").tobytes()
    for i in range(0, len(data), 1001):  # odd-sized messages
        push.push(data[i : i + 1001])
    push.end_of_speech()
    assert buffer.depth_samples % TICK == 0
    assert 48_000 <= buffer.depth_samples < 48_000 + 2 * TICK
    out = buffer.pull(buffer.depth_samples).samples.astype(np.float64)
    spectrum = np.abs(np.fft.rfft(out[4800:43200]))
    peak_hz = np.argmax(spectrum) * 48_000 / len(out[4800:43200])
    assert abs(peak_hz - 440) < 3
    assert np.sqrt(np.mean(out[4800:43200] ** 2)) > 0.25 * 32768 / np.sqrt(2)


def test_odd_trailing_byte_waits_for_the_next_message() -> None:
    push, buffer = make_push(48_000)
    samples = np.arange(1, 961, dtype=np.int16)
    data = samples.astype("<i2").tobytes()
    push.push(data[:101])
    push.push(data[101:])
    push.end_of_speech()
    assert buffer.depth_samples == TICK
    out = buffer.pull(TICK).samples
    np.testing.assert_array_equal(out[:960], samples)  # 48 kHz in: passed through exactly
    np.testing.assert_array_equal(out[960:], 0)  # flush padding to a whole tick


def test_a_message_over_the_bound_is_refused_whole() -> None:
    push, buffer = make_push(48_000, max_buffer_s=1.0)
    push.push(np.ones(40_000, np.int16).tobytes())
    with pytest.raises(PushBufferFull, match="nothing of it was queued"):
        push.push(np.ones(9_600, np.int16).tobytes())
    assert buffer.stats.overflow_samples == 0
    assert push.refused_bytes == 19_200
    push.push(np.ones(4_800, np.int16).tobytes())  # what fits still goes in
    assert buffer.stats.pushed_samples == 44_160  # whole 20 ms blocks; the rest waits for more


def test_buffer_interrupt_drops_everything_and_flush_primes() -> None:
    buffer = InputAudioBuffer(48_000, target_ms=80, trim_hysteresis_ms=None)
    buffer.push(np.ones(3000, np.int16), True)
    assert buffer.flush(TICK) == 840
    assert not buffer.pull(TICK).underrun  # primed below the 80 ms target
    assert buffer.interrupt() == TICK
    assert buffer.depth_samples == 0 and buffer.stats.interrupted_samples == TICK
    buffer.push(np.ones(TICK, np.int16), True)
    assert buffer.pull(TICK).input_pos is None  # not primed again until the target


def test_no_trimming_when_hysteresis_is_none() -> None:
    buffer = InputAudioBuffer(48_000, target_ms=40, trim_hysteresis_ms=None, max_ms=10_000)
    for _ in range(100):
        buffer.push(np.zeros(960, np.int16), False)  # 2 s of silence, far above the target
    while buffer.depth_samples >= TICK:
        buffer.pull(TICK)
    assert buffer.stats.trimmed_samples == 0 and buffer.stats.pulled_samples == 96_000


async def test_stream_interrupt_silences_unsent_ticks_and_rests_the_mouth() -> None:
    renderer = ManualRenderer()
    stream, buffer, clock = make_stream(renderer, lookahead_samples=320, crossfade_frames=3)
    speech = to_int16(speech_pattern([("speech", 0.9)]))
    for i in range(0, len(speech), 960):
        buffer.push(speech[i : i + 960], True)
    stream.start()
    await clock.advance(0.5)
    assert renderer.submitted and stream._mix > 0
    unsent = [i for i in stream._ticks if stream.present_time(i) > clock.now()]
    assert unsent
    silenced = stream.interrupt()
    assert silenced == len(unsent)
    assert renderer.cancelled == ["s1"] and buffer.depth_samples == 0
    for i in unsent:
        tick = stream._ticks[i]
        assert tick.patch is None and not tick.speech and tick.input_pos is None
        assert not tick.audio.any()
    rendered = len(renderer.submitted)
    await clock.advance(0.4)
    later = [stream._ticks[i] for i in sorted(stream._ticks) if i > max(unsent)]
    bad = [(t.index, t.patch is None, int(np.abs(t.audio).max()), t.input_pos) for t in later]
    assert later and all(t.patch is None and not t.audio.any() and t.input_pos is None for t in later), bad
    assert len(renderer.submitted) == rendered  # nothing rendered from the dropped audio
    await stream.stop()
