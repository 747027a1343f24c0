"""What WHEP viewers cost: server CPU per extra viewer, and each viewer's latency relative to the caller.

    .venv/bin/python -m lipcast.probe.viewer_bench [--viewers 0,1,2,4] [--measure-s 6]

Starts ``lipcast serve`` as a child process (loopback ICE only, so its CPU time is its own), places one call
through the call page's JSON /offer (the controller, receiving the avatar), then adds WHEP viewers step by
step. At each step it waits ``--settle-s`` and reads the server's CPU time (user + system, from /proc) over
``--measure-s``. Latency: every frame that reached both the caller and a viewer, matched by tick number
(per-frame metadata + RTP timestamps), viewer arrival minus caller arrival. Prints a table; ``--json``
writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from lipcast.probe.patterns import burst_pattern
from lipcast.probe.wish import Peer, open_publisher, open_viewer
from lipcast.streaming.rtc import restrict_host_addresses

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S  # utime, stime (fields 14, 15)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_ready(http: aiohttp.ClientSession, url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{url}/healthz") as response:
                if response.status == 200 and (await response.json()).get("ready"):
                    return
        await asyncio.sleep(0.5)
    raise RuntimeError("the server did not become ready")


def latency_ms(controller: Peer, viewer: Peer) -> list[float]:
    own, seen = controller.frame_arrivals(), viewer.frame_arrivals()
    return [(seen[k] - own[k]) * 1000.0 for k in sorted(set(own) & set(seen))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    restrict_host_addresses(["127.0.0.1"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    steps = sorted({int(n) for n in args.viewers.split(",")})
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "lipcast", "serve", "--port", str(port), "--ice-address", "127.0.0.1"),
        *("--max-viewers", str(max(steps) + 1), "--log-level", "WARNING"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    viewers: list[Peer] = []
    controller: Peer | None = None
    results: dict[str, Any] = {"steps": [], "server_pid": server.pid}
    try:
        async with aiohttp.ClientSession() as http:
            try:
                await wait_ready(http, url)
                duration_s = len(steps) * (args.settle_s + args.measure_s) + 10.0
                audio = burst_pattern(duration_s)
                controller = await open_publisher(http, url, audio, signalling="offer")
                await controller.wait_connected()
                assert controller.session_id is not None
                await asyncio.sleep(args.settle_s)
                for count in steps:
                    while len(viewers) < count:
                        viewer = await open_viewer(http, url, controller.session_id)
                        await viewer.wait_connected()
                        viewers.append(viewer)
                    await asyncio.sleep(args.settle_s)
                    cpu0, t0 = process_cpu_s(server.pid), time.monotonic()
                    await asyncio.sleep(args.measure_s)
                    cpu1, t1 = process_cpu_s(server.pid), time.monotonic()
                    step = {"viewers": count, "server_cpu_percent": 100.0 * (cpu1 - cpu0) / (t1 - t0)}
                    results["steps"].append(step)
                    print(
                        f"{count} viewer(s): server CPU {step['server_cpu_percent']:.1f} % of one core",
                        flush=True,
                    )
                async with http.get(f"{url}/sessions/{controller.session_id}") as response:
                    results["session"] = await response.json()
            finally:
                for viewer in viewers:
                    await viewer.close()
                if controller is not None:
                    await controller.close()
    finally:
        server.terminate()
        try:
            await asyncio.wait_for(server.wait(), 10)
        except TimeoutError:
            server.kill()
            await server.wait()

    base = results["steps"][0]["server_cpu_percent"]
    for step in results["steps"]:
        step["extra_cpu_percent"] = step["server_cpu_percent"] - base
    lags: list[float] = []
    per_viewer = []
    for viewer in viewers:
        assert controller is not None
        lag = latency_ms(controller, viewer)
        lags += lag
        per_viewer.append({"frames": len(lag), "median_ms": float(np.median(lag)) if lag else None})
    results["latency_ms"] = {
        "frames": len(lags),
        "median": float(np.median(lags)) if lags else None,
        "p95": float(np.percentile(lags, 95)) if lags else None,
        "p5": float(np.percentile(lags, 5)) if lags else None,
        "per_viewer": per_viewer,
    }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lipcast.probe.viewer_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--viewers", default="0,1,2,4", help="viewer counts to measure, in order")
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--measure-s", type=float, default=6.0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args))
    print()
    print("viewers  server CPU (% of a core)  extra vs 0 viewers")
    for step in results["steps"]:
        print(
            f"{step['viewers']:>7}  {step['server_cpu_percent']:>24.1f}  {step['extra_cpu_percent']:>18.1f}"
        )
    steps = results["steps"]
    if len(steps) >= 2 and steps[-1]["viewers"] > steps[1]["viewers"] >= 1:
        first = steps[1]["extra_cpu_percent"] / steps[1]["viewers"] if steps[1]["viewers"] == 1 else None
        further = (steps[-1]["server_cpu_percent"] - steps[1]["server_cpu_percent"]) / (
            steps[-1]["viewers"] - steps[1]["viewers"]
        )
        if first is not None:
            print(f"first viewer (starts the shared VP8+Opus encoder): {first:+.1f} % of a core")
        print(f"each further viewer (packetize + SRTP + send only): {further:+.1f} % of a core")
        results["first_viewer_cpu_percent"] = first
        results["further_viewer_cpu_percent"] = further
    lat = results["latency_ms"]
    if lat["frames"]:
        print(
            f"viewer latency vs the caller, {lat['frames']} frames: median {lat['median']:+.1f} ms, "
            f"5-95 % {lat['p5']:+.1f} .. {lat['p95']:+.1f} ms"
        )
    encoder = results.get("session", {}).get("viewers", {}).get("encoder")
    if encoder and encoder.get("video_frames"):
        print(f"shared VP8 encode: {encoder['video_encode_ms'] / encoder['video_frames']:.2f} ms per frame")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
