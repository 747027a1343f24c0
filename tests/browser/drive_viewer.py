"""Run inside a loopback-only network namespace: serve lipcast, start a WHIP session from Python (speech as
its microphone), open the OBS viewer page for it in headless Chromium and print what the page saw as JSON;
``--screenshot`` also saves the page as a PNG (the README's picture).

    ip netns exec NS .venv/bin/python -m tests.browser.drive_viewer --seconds 6 [--screenshot docs/viewer.png]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from lipcast.probe.patterns import burst_pattern
from lipcast.probe.wish import open_publisher
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.streaming.rtc import restrict_host_addresses
from tests.browser.drive_call import DevTools, free_port, launch_browser, page_socket, stop_browser

TOKEN = "viewer-test-token"
POLL_JS = """
(() => {
  const v = document.querySelector('video');
  if (!v || !document.body) return {state: 'loading', mouth: null};
  const out = {state: document.body.dataset.state, muted: v.muted, paused: v.paused,
               width: v.videoWidth, height: v.videoHeight, time: v.currentTime,
               background: getComputedStyle(document.body).backgroundColor,
               fit: getComputedStyle(v).objectFit, controls: v.controls, mouth: null};
  if (v.videoWidth > 0 && v.readyState >= 2) {  // a frame is there to draw
    const [x1, y1, x2, y2] = %s;
    const c = window.__probeCanvas || (window.__probeCanvas = document.createElement('canvas'));
    c.width = 16; c.height = 16;
    const g = c.getContext('2d', {willReadFrequently: true});
    g.drawImage(v, x1, y1, x2 - x1, y2 - y1, 0, 0, 16, 16);
    const d = g.getImageData(0, 0, 16, 16).data;
    out.mouth = Array.from({length: 256}, (_, i) => Math.round((d[4*i] + d[4*i+1] + d[4*i+2]) / 3));
  }
  return out;
})()
"""


class Tools(DevTools):
    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self._id += 1
        await self.ws.send_json({"id": self._id, "method": method, "params": params or {}})
        while True:
            message = await self.ws.receive_json(timeout=20)
            if message.get("id") == self._id:
                return message.get("result", {})


async def run(args: argparse.Namespace) -> dict[str, Any]:
    restrict_host_addresses(["127.0.0.1"])
    app = create_app(Settings(auth_token=TOKEN))
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    devtools_port = free_port()
    profile = ""
    polls: list[dict[str, Any]] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        async with aiohttp.ClientSession() as http:
            publisher = await open_publisher(
                http, base, burst_pattern(args.seconds + 30, lead_in_s=0.5), receive=False, token=TOKEN
            )
            try:
                await publisher.wait_connected()
                async with http.get(f"{base}/avatars") as response:
                    avatars = await response.json()
                box = next(a for a in avatars["avatars"] if a["name"] == avatars["default"])["mouth_box"]
                page = f"{base}/static/viewer.html?session={publisher.session_id}&bg={args.bg}&token={TOKEN}"
                proc, profile = launch_browser(
                    args.chromium,
                    page,
                    devtools_port,
                    f"--window-size={args.width},{args.height}",
                    "--hide-scrollbars",
                )
                ws_url = await page_socket(http, devtools_port, time.monotonic() + 20)
                async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                    tools = Tools(ws)
                    # The canvas OBS would give the Browser Source (headless windows lose some to chrome).
                    metrics = {
                        "width": args.width,
                        "height": args.height,
                        "deviceScaleFactor": 1,
                        "mobile": False,
                    }
                    await tools.call("Emulation.setDeviceMetricsOverride", metrics)
                    end = time.monotonic() + args.seconds
                    while time.monotonic() < end:
                        polls.append(await tools.evaluate(POLL_JS % json.dumps(box)))
                        await asyncio.sleep(0.05)
                    if args.screenshot is not None:
                        shot = await tools.call("Page.captureScreenshot", {"format": "png"})
                        args.screenshot.write_bytes(base64.b64decode(shot["data"]))
                async with http.get(
                    f"{base}/sessions/{publisher.session_id}", headers={"Authorization": f"Bearer {TOKEN}"}
                ) as response:
                    viewers = (await response.json())["viewers"]
            finally:
                await publisher.close()
    finally:
        stop_browser(proc, profile)
        await runner.cleanup()
    return {"polls": polls, "viewers": viewers}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--bg", default="green")
    parser.add_argument("--width", type=int, default=960)
    parser.add_argument("--height", type=int, default=540)
    parser.add_argument("--screenshot", type=Path)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args()
    json.dump(asyncio.run(run(args)), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
