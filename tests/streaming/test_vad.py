from __future__ import annotations

import numpy as np
import pytest

from lipcast.streaming.vad import Reblocker, SpeechDetector
from tests.fakes import speech_pattern, to_int16


def test_reblocker_cuts_fixed_blocks_and_keeps_the_rest() -> None:
    r = Reblocker(4)
    assert [b.tolist() for b in r.feed(np.arange(6, dtype=np.int16))] == [[0, 1, 2, 3]]
    assert [b.tolist() for b in r.feed(np.arange(6, 9, dtype=np.int16))] == [[4, 5, 6, 7]]


def test_voiced_audio_is_speech_and_silence_is_not() -> None:
    audio = to_int16(speech_pattern([("silence", 1.0), ("speech", 1.0), ("silence", 1.0)]))
    detector = SpeechDetector(48_000, aggressiveness=2, hangover_ms=0)
    flags = [detector.is_speech(audio[i : i + 960]) for i in range(0, len(audio) - 959, 960)]
    per_second = np.array(flags[:150]).reshape(3, 50).mean(axis=1)
    assert per_second[0] < 0.1 and per_second[1] > 0.8 and per_second[2] < 0.2


def test_hangover_extends_speech() -> None:
    audio = to_int16(speech_pattern([("speech", 0.5), ("silence", 0.5)]))
    detector = SpeechDetector(48_000, hangover_ms=100)
    flags = [detector.is_speech(audio[i : i + 960]) for i in range(0, len(audio) - 959, 960)]
    last_voiced = max(i for i, f in enumerate(flags[:25]) if f)
    assert all(flags[last_voiced : last_voiced + 5])


def test_rejects_bad_block_and_rate() -> None:
    with pytest.raises(ValueError):
        SpeechDetector(44_100)
    with pytest.raises(ValueError):
        SpeechDetector(48_000).is_speech(np.zeros(100, np.int16))
