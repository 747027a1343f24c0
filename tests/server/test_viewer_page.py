"""The OBS viewer page in a real browser: headless Chromium watches a WHIP session over WHEP, in a
loopback-only network namespace (like tests/server/test_browser.py; CI installs chromium and runs as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)"),
    pytest.mark.skipif(
        shutil.which("ip") is None or os.geteuid() != 0,
        reason="needs root and iproute2 for a loopback-only network namespace",
    ),
]


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"lipcast-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_viewer_page_plays_the_session_with_sound_on_a_green_background(netns: str, tmp_path: Path) -> None:
    shot = tmp_path / "viewer.png"
    run = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-m", "tests.browser.drive_viewer"]
        + ["--seconds", "5", "--chromium", str(CHROMIUM), "--screenshot", str(shot), "--width", "640"]
        + ["--height", "360", "--bg", "00ff00"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    polls = [p for p in result["polls"] if p["state"] != "loading"]
    last = polls[-1]
    assert last["state"] == "playing", [p["state"] for p in polls]
    # Sound on (OBS's Browser Source, like this browser, allows autoplay), no controls, fitted, green around.
    assert not last["muted"] and not last["paused"] and not last["controls"]
    assert (last["width"], last["height"]) == (320, 320)
    assert last["fit"] == "contain" and last["background"] == "rgb(0, 255, 0)"
    # Frames keep coming, and the mouth moves with the WHIP client's speech.
    playing = [p for p in polls if p["state"] == "playing" and p["mouth"] is not None]
    assert playing[-1]["time"] - playing[0]["time"] > 2.5
    mouths = np.array([p["mouth"] for p in playing], dtype=np.float64)
    assert np.abs(np.diff(mouths, axis=0)).mean(axis=1).max() > 3.0
    assert result["viewers"]["count"] == 1
    assert shot.read_bytes().startswith(b"\x89PNG")
