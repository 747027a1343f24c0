"""Run inside a loopback-only network namespace: serve lipcast, call it from headless Chromium with a WAV
file as the microphone, and print what the page saw as JSON (driven over the DevTools protocol).

    ip netns exec NS .venv/bin/python -m tests.browser.drive_call --wav speech.wav --seconds 9
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.streaming.rtc import restrict_host_addresses

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
]

# Each poll: the page's state and stats, and a 16x16 grey thumbnail of the mouth box of the current frame.
POLL_JS = """
(() => {
  const v = document.querySelector('video');
  const out = {t: performance.now(), state: (document.body && document.body.dataset.state) || null,
               stats: window.lipcast ? window.lipcast.stats() : null, mouth: null};
  // readyState >= 2 (HAVE_CURRENT_DATA): a frame is there to draw (before it, drawImage gives black).
  if (v && v.videoWidth > 0 && v.readyState >= 2) {
    const [x1, y1, x2, y2] = %s;
    const c = window.__probeCanvas || (window.__probeCanvas = document.createElement('canvas'));
    c.width = 16; c.height = 16;
    const g = c.getContext('2d', {willReadFrequently: true});
    g.drawImage(v, x1, y1, x2 - x1, y2 - y1, 0, 0, 16, 16);
    const d = g.getImageData(0, 0, 16, 16).data;
    const grey = [];
    for (let i = 0; i < d.length; i += 4) grey.push(Math.round((d[i] + d[i + 1] + d[i + 2]) / 3));
    out.mouth = grey;
    out.currentTime = v.currentTime;
  }
  return out;
})()
"""


# The current video frame at its own size, as a PNG data URL.
FRAME_JS = """
(() => {
  const v = document.querySelector('video');
  if (!v || !v.videoWidth || v.readyState < 2) return null;
  const c = document.createElement('canvas');
  c.width = v.videoWidth; c.height = v.videoHeight;
  c.getContext('2d').drawImage(v, 0, 0);
  return c.toDataURL('image/png');
})()
"""


def launch_browser(
    chromium: str, url: str, devtools_port: int, *extra: str, flags: list[str] = CHROMIUM_FLAGS
) -> tuple[subprocess.Popen[bytes], str]:
    """Headless Chromium on ``url`` with a fresh profile and a DevTools port; returns (process, profile)."""
    profile = tempfile.mkdtemp(prefix="lipcast-chromium-")
    proc = subprocess.Popen(
        [
            chromium,
            *flags,
            *extra,
            f"--user-data-dir={profile}",
            f"--remote-debugging-port={devtools_port}",
            url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, profile


def stop_browser(proc: subprocess.Popen[bytes] | None, profile: str) -> None:
    """End the browser (politely, then not) and remove its profile."""
    if proc is not None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc.poll() is None:
            proc.kill()
    if profile:
        shutil.rmtree(profile, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DevTools:
    """The smallest DevTools-protocol client: evaluate an expression in the page."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._id = 0

    async def evaluate(self, expression: str) -> Any:
        self._id += 1
        await self.ws.send_json(
            {
                "id": self._id,
                "method": "Runtime.evaluate",
                "params": {"expression": expression, "returnByValue": True, "awaitPromise": True},
            }
        )
        while True:
            message = await self.ws.receive_json(timeout=10)
            if message.get("id") == self._id:
                result = message.get("result", {})
                if "exceptionDetails" in result:
                    raise RuntimeError(str(result["exceptionDetails"]))
                return result.get("result", {}).get("value")


async def page_socket(http: aiohttp.ClientSession, port: int, deadline_s: float) -> str:
    while time.monotonic() < deadline_s:
        with contextlib.suppress(aiohttp.ClientError, json.JSONDecodeError):
            async with http.get(f"http://127.0.0.1:{port}/json") as response:
                for target in await response.json():
                    if target.get("type") == "page" and target.get("webSocketDebuggerUrl"):
                        return str(target["webSocketDebuggerUrl"])
        await asyncio.sleep(0.2)
    raise TimeoutError("chromium's DevTools endpoint did not come up")


async def run(
    wav: Path,
    seconds: float,
    chromium: str,
    size: str | None = None,
    codec: str | None = None,
    avatar: str | None = None,
    frame_png: Path | None = None,
) -> dict[str, Any]:
    """``size``, ``codec``, ``avatar``: what the page asks for (its ?size=, ?codec=, ?avatar=);
    ``frame_png``: where to write the decoded picture of the poll with the most mouth motion (a PNG at the
    video's own size)."""
    restrict_host_addresses(["127.0.0.1"])
    hd_sizes = "1280x720" if avatar and avatar.endswith("-720p") else ""
    app = create_app(Settings(port=free_port(), builtin_hd_sizes=hd_sizes))
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    devtools_port = free_port()
    url = f"http://127.0.0.1:{port}/?autostart=1&ec=0&ns=0&agc=0"
    for name, value in (("size", size), ("codec", codec), ("avatar", avatar)):
        if value:
            url += f"&{name}={value}"
    proc, profile = launch_browser(
        chromium, url, devtools_port, f"--use-file-for-fake-audio-capture={wav}%noloop"
    )
    polls: list[dict[str, Any]] = []
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/avatars") as response:
                avatars = await response.json()
            box = next(a for a in avatars["avatars"] if a["name"] == (avatar or avatars["default"]))[
                "mouth_box"
            ]
            ws_url = await page_socket(http, devtools_port, time.monotonic() + 20)
            async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                tools = DevTools(ws)
                end = time.monotonic() + seconds
                best, best_png = -1.0, b""
                while time.monotonic() < end:
                    poll = await tools.evaluate(POLL_JS % json.dumps(box))
                    polls.append(poll)
                    if frame_png is not None and poll and poll.get("mouth") and len(polls) > 20:
                        motion = float(np.std(poll["mouth"]))
                        if motion > best:
                            best = motion
                            shot = await tools.evaluate(FRAME_JS)
                            best_png = base64.b64decode(shot.split(",", 1)[1]) if shot else best_png
                    await asyncio.sleep(0.05)
                final_state = await tools.evaluate("document.body && document.body.dataset.state")
                if frame_png is not None and best_png:
                    await asyncio.to_thread(frame_png.write_bytes, best_png)
    finally:
        stop_browser(proc, profile)
        await runner.cleanup()
    return {"polls": polls, "final_state": final_state, "mouth_box": box}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wav", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    parser.add_argument("--size", help="the video size the page asks for, WIDTHxHEIGHT")
    parser.add_argument("--codec", choices=("vp8", "h264"), help="the only video codec the page offers")
    parser.add_argument("--avatar", help="the avatar the page asks for")
    parser.add_argument("--frame-png", type=Path, help="write the most animated decoded frame here")
    args = parser.parse_args()
    result = asyncio.run(
        run(args.wav, args.seconds, args.chromium, args.size, args.codec, args.avatar, args.frame_png)
    )
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
