"""The OBS viewer page in a real browser: headless Chromium watches a WHIP session over WHEP, in a
loopback-only network namespace (like tests/server/test_browser.py; CI installs chromium and runs as root)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.system import CHROMIUM, needs_chromium, needs_netns, run_in_netns

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
    needs_netns,
]


def test_viewer_page_plays_the_session_with_sound_on_a_green_background(netns: str, tmp_path: Path) -> None:
    shot = tmp_path / "viewer.png"
    result = run_in_netns(
        netns,
        "tests.browser.drive_viewer",
        "--seconds",
        "5",
        "--chromium",
        str(CHROMIUM),
        "--screenshot",
        str(shot),
        "--width",
        "640",
        "--height",
        "360",
        "--bg",
        "00ff00",
    )
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
    # The screenshot shows that picture: the square video fitted to the 360 px height in the middle, the
    # page's green on both sides, the avatar (not green) inside.
    picture = cv2.imread(str(shot), cv2.IMREAD_COLOR)
    assert picture is not None and picture.shape[:2] == (360, 640), None if picture is None else picture.shape
    green = np.all(np.abs(picture.astype(np.int16) - (0, 255, 0)) <= 8, axis=2)  # BGR
    assert green[:, :120].all() and green[:, -120:].all()
    assert green[:, 200:440].mean() < 0.2
