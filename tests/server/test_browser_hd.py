"""A real Chromium call at 1280x720 (the built-in avatar's 720p scene), once in H.264 and once in VP8: the
browser decodes 1280x720 frames of the codec it was made to offer, at 24 fps or more, and the mouth moves
with the speech. Skipped where chromium or network namespaces are missing, as tests/server/test_browser.py."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from tests.fakes import speech_pattern, to_int16
from tests.system import CHROMIUM, needs_chromium, needs_netns, run_in_netns

PATTERN = [("silence", 2.0), ("speech", 2.0), ("silence", 1.5), ("speech", 1.5), ("silence", 2.0)]
SECONDS = 9

pytestmark = [pytest.mark.slow, needs_chromium, needs_netns]


def write_wav(path: Path) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48_000)
        w.writeframes(to_int16(speech_pattern(PATTERN)).tobytes())


@pytest.mark.parametrize("codec", ["h264", "vp8"])
def test_a_720p_call_decodes_1280x720_at_24_fps(netns: str, tmp_path: Path, codec: str) -> None:
    wav = tmp_path / "speech.wav"
    write_wav(wav)
    args = ["--wav", str(wav), "--seconds", str(SECONDS), "--chromium", str(CHROMIUM)]
    args += ["--size", "1280x720", "--codec", codec, "--avatar", "astronaut-720p"]
    result = run_in_netns(netns, "tests.browser.drive_call", *args)
    assert result["final_state"] == "connected"
    polls = [p for p in result["polls"] if p and p.get("stats") and p["stats"].get("framesDecoded")]
    assert len(polls) > 30, "the video never played"
    last = polls[-1]["stats"]
    assert (last["frameWidth"], last["frameHeight"]) == (1280, 720), last
    assert (last["codec"] or "").lower() == f"video/{codec}", last
    # Frames decoded per second from the first second of video on, on the stats' own clock.
    stats = [p["stats"] for p in polls]
    first = next(s for s in stats if s["timestamp"] >= stats[0]["timestamp"] + 1000.0)
    span_s = (stats[-1]["timestamp"] - first["timestamp"]) / 1000.0
    rate = (stats[-1]["framesDecoded"] - first["framesDecoded"]) / span_s
    assert span_s >= 4.5 and rate >= 24.0, (rate, span_s)  # the call plays ~6 s of video
    thumbs = np.asarray([p["mouth"] for p in polls if p.get("mouth")], dtype=np.float64)
    painted = thumbs[thumbs.max(axis=1) > 0]
    rest = np.median(painted[:10], axis=0)  # the WAV starts with 2 s of silence
    motion = np.abs(painted - rest).mean(axis=1)
    assert (motion > 6.0).sum() >= 5, motion.round(1).tolist()
