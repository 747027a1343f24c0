"""A real browser call: headless Chromium with a WAV file as its microphone, in a loopback-only network
namespace together with the server. Runs wherever chromium and network namespaces are available (CI
installs chromium and runs as root)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from tests.fakes import speech_pattern, to_int16
from tests.system import CHROMIUM, needs_chromium, needs_netns, run_in_netns

PATTERN = [
    ("silence", 2.0),
    ("speech", 1.2),
    ("silence", 1.3),
    ("speech", 1.5),
    ("silence", 1.5),
    ("speech", 1.0),
    ("silence", 2.0),
]

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
    needs_netns,
]


def write_wav(path: Path) -> None:
    audio = to_int16(speech_pattern(PATTERN))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48_000)
        w.writeframes(audio.tobytes())


def movement_episodes(moving: np.ndarray, times_ms: np.ndarray, min_gap_ms: float = 500.0) -> int:
    episodes, last = 0, None
    for t, m in zip(times_ms, moving, strict=True):
        if m:
            if last is None or t - last > min_gap_ms:
                episodes += 1
            last = t
    return episodes


def test_browser_call_decodes_frames_and_the_mouth_follows_speech(netns: str, tmp_path: Path) -> None:
    wav = tmp_path / "speech.wav"
    write_wav(wav)
    result = run_in_netns(
        netns,
        "tests.browser.drive_call",
        "--wav",
        str(wav),
        "--seconds",
        "13",
        "--chromium",
        str(CHROMIUM),
    )
    polls = [p for p in result["polls"] if p and p.get("mouth")]
    # From the first frame painted on: a busy machine may report the video's size a poll before the page
    # has a frame to draw (all black).
    painted = next((i for i, p in enumerate(polls) if max(p["mouth"]) > 0), len(polls))
    polls = polls[painted:]
    assert result["final_state"] == "connected"
    assert len(polls) > 50, "the video never played"

    decoded = [p["stats"]["framesDecoded"] for p in polls if p.get("stats")]
    assert decoded and decoded[-1] >= 20 * 8, decoded[-1:]  # >= 20 fps over the last ~9 s at least
    fps = [p["stats"]["fps"] for p in polls[len(polls) // 2 :] if p.get("stats") and p["stats"].get("fps")]
    assert np.median(fps) >= 20, fps

    thumbs = np.asarray([p["mouth"] for p in polls], dtype=np.float64)
    times = np.asarray([p["t"] for p in polls])
    rest = np.median(thumbs[:10], axis=0)  # the WAV starts with 2 s of silence
    motion = np.abs(thumbs - rest).mean(axis=1)
    assert motion[:10].max() < 1.5, motion[:10]
    moving = motion > 6.0
    still = motion < 1.5
    assert moving.sum() >= 10 and still.sum() >= 20, (moving.sum(), still.sum())
    assert movement_episodes(moving, times) == 3, motion.round(1).tolist()
