"""Run inside a network namespace (tests/interop/test_clients.py makes it): serve lipcast, let a WebRTC client
that others wrote publish to it (WHIP) or watch it (WHEP) for ``--seconds``, and print one JSON object: what
the server saw (its requests, the session's inbound audio and video) and what the client reported.

    ip netns exec NS .venv/bin/python -m tests.interop.drive CLIENT --address 10.231.0.1 [--token T]

Clients: ``gst-whip`` and ``gst-whep`` (GStreamer's webrtcbin as a WHIP source trickling by PATCH and as a
WHEP viewer: tests/interop/gst_client.py), ``obs`` (libdatachannel,
OBS's WebRTC library, through node-datachannel: tests/interop/obs_whip.mjs), ``chromium`` (the npm package
whip-whep's WHIPClient and WHEPClient in headless Chromium: tests/interop/page/whip_whep_page.html), and
``firefox`` (the same page in Firefox ESR, driven by Marionette).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import av
from aiohttp import web
from aiortc.codecs.opus import OpusEncoder

from lipcast.probe.patterns import burst_pattern
from lipcast.probe.wish import open_publisher
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.sessions import Session
from lipcast.server.state import RUNTIME
from lipcast.streaming.rtc import JITTER_BUFFER_ATTRIBUTE, DiscardJitterBuffer, restrict_host_addresses
from tests.browser.drive_call import (
    CHROMIUM_FLAGS,
    DevTools,
    free_port,
    launch_browser,
    page_socket,
    stop_browser,
)

HERE = Path(__file__).resolve().parent
NODE_MODULES = HERE / "node_modules"
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with PyGObject and GStreamer's introspection data


class Server:
    """lipcast in this process, with a log of every request it answered."""

    def __init__(self, address: str, token: str | None) -> None:
        self.address, self.token = address, token
        self.requests: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.base = ""
        self.port = 0

    async def start(self, static: dict[str, Path] | None = None) -> None:
        restrict_host_addresses([self.address])
        app = create_app(Settings(auth_token=self.token, connect_timeout_s=20))
        app.middlewares.insert(0, self.log_requests)
        for prefix, folder in (static or {}).items():
            app.router.add_static(prefix, folder)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        self.port = free_port()
        # Every address of the namespace: clients use the LAN address, the browser page 127.0.0.1 (a secure
        # context, which getUserMedia needs). ICE stays on the LAN address (restrict_host_addresses).
        await web.TCPSite(self.runner, "0.0.0.0", self.port).start()
        self.base = f"http://{self.address}:{self.port}"
        async with aiohttp.ClientSession() as http:  # ready once warmed up
            for _ in range(600):
                async with http.get(f"{self.base}/readyz") as response:
                    if response.status == 200:
                        return
                await asyncio.sleep(0.1)
        raise TimeoutError("lipcast did not become ready")

    @web.middleware
    async def log_requests(self, request: web.Request, handler: Any) -> web.StreamResponse:
        start = time.perf_counter()
        body = await request.text() if request.method == "PATCH" else ""
        response = await handler(request)
        entry = {
            "method": request.method,
            "path": request.path,
            "status": response.status,
            "ms": round((time.perf_counter() - start) * 1000, 1),
            "content_type": request.headers.get("Content-Type"),
            "if_match": request.headers.get("If-Match"),
            "authorized": "Authorization" in request.headers,
        }
        if request.method == "PATCH":
            entry["candidates"] = body.count("a=candidate:")
            entry["mdns_candidates"] = body.count(".local ")
        self.requests.append(entry)
        return response

    @property
    def app(self) -> web.Application:
        assert self.runner is not None
        return self.runner.app

    def whip_sessions(self) -> list[Session]:
        return [s for s in self.app[RUNTIME].sessions.sessions.values() if s.signalling == "whip"]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise TimeoutError(what)


def connected_session(server: Server) -> Session | None:
    return next((s for s in server.whip_sessions() if s.pc.connectionState == "connected"), None)


async def observe_publisher(server: Server, seconds: float) -> dict[str, Any]:
    """The WHIP session's inbound media over ``seconds`` from its connection (``error`` if none came up)."""
    try:
        session: Session = await wait_for(lambda: connected_session(server), 30, "no WHIP session connected")
        await wait_for(lambda: session.ingest is not None, 10, "no inbound audio track")
    except TimeoutError as e:
        states = {s.id: s.pc.connectionState for s in server.whip_sessions()}
        return {"error": str(e), "sessions": states}
    assert session.ingest is not None
    start_frames, start = session.ingest.frames_received, time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - start
    frames = session.ingest.frames_received - start_frames
    video = [
        getattr(t.receiver, JITTER_BUFFER_ATTRIBUTE, None)
        for t in session.pc.getTransceivers()
        if t.kind == "video"
    ]
    remote = session.pc.getTransceivers()[0].receiver.transport.transport.getRemoteCandidates()
    return {
        "connection": session.pc.connectionState,
        "audio_frames": frames,
        "audio_fps": frames / elapsed,
        "video_packets_dropped": sum(v.discarded for v in video if isinstance(v, DiscardJitterBuffer)),
        "remote_candidate_types": sorted({c.type for c in remote}),
        "session_id": session.id,
    }


async def stop_process(proc: asyncio.subprocess.Process, sig: int = signal.SIGINT) -> tuple[str, str]:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    out = await proc.stdout.read() if proc.stdout else b""
    err = await proc.stderr.read() if proc.stderr else b""
    return out.decode(errors="replace"), err.decode(errors="replace")


async def spawn(*command: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


# ---- the clients ----


async def gst_whip(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    command = [SYSTEM_PYTHON, str(HERE / "gst_client.py"), "whip", "--url", f"{server.base}/whip"]
    command += ["--seconds", str(args.seconds + 2)] + (["--token", server.token] if server.token else [])
    proc = await spawn(*command)
    try:
        seen = await observe_publisher(server, args.seconds)
    finally:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    await asyncio.sleep(0.3)
    return {"server": seen, "client": client_json(out, err), "sessions_left": len(server.whip_sessions())}


def client_json(out: str | bytes, err: str | bytes) -> dict[str, Any]:
    """A client's one JSON object (its stderr's end added), or one that says what went wrong."""
    out = out.decode(errors="replace") if isinstance(out, bytes) else out
    err = err.decode(errors="replace") if isinstance(err, bytes) else err
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        result = {"errors": [f"no JSON from the client: {out[-500:]}"]}
    result["stderr"] = err[-2000:]
    return result


async def gst_whep(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        audio = burst_pattern(args.seconds + 40, lead_in_s=0.5)
        publisher = await open_publisher(http, server.base, audio, receive=False, token=server.token)
        try:
            await publisher.wait_connected()
            url = f"{server.base}/whep/{publisher.session_id}"
            command = [SYSTEM_PYTHON, str(HERE / "gst_client.py"), "whep", "--url", url]
            command += ["--seconds", str(args.seconds), "--setup", args.setup]
            command += ["--token", server.token] if server.token else []
            proc = await spawn(*command)
            out, err = await asyncio.wait_for(proc.communicate(), args.seconds + 60)
        finally:
            await publisher.close()
    return {"viewer": client_json(out, err)}


def opus_packets(path: Path, seconds: float) -> int:
    """Speech-like audio encoded as OBS would send it: 20 ms Opus packets, length-prefixed, in a file."""
    audio = burst_pattern(seconds, lead_in_s=0.5)
    encoder = OpusEncoder()
    count = 0
    with path.open("wb") as f:
        for start in range(0, len(audio) - 960 + 1, 960):
            frame = av.AudioFrame.from_ndarray(audio[None, start : start + 960], format="s16", layout="mono")
            frame.sample_rate, frame.pts = 48_000, start
            payloads, _ = encoder.encode(frame)
            for payload in payloads:
                f.write(struct.pack(">H", len(payload)) + payload)
                count += 1
    return count


async def obs(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    packets = HERE / f".obs-opus-{os.getpid()}.bin"
    count = opus_packets(packets, args.seconds + 5)
    command = ["node", str(HERE / "obs_whip.mjs"), "--url", f"{server.base}/whip", "--opus", str(packets)]
    command += ["--end-of-candidates", "yes" if args.end_of_candidates else "no"]
    command += ["--token", server.token] if server.token else []
    proc = await spawn(*command)
    try:
        seen = await observe_publisher(server, args.seconds)
    finally:
        out, err = await stop_process(proc, signal.SIGTERM)
        packets.unlink(missing_ok=True)
    return {"server": seen, "client": client_json(out, err), "packets_encoded": count}


PAGE_POLL = "window.interop ? window.interop.poll() : null"
PAGE_STOP = "window.interop && window.interop.stop()"
ASYNC_SCRIPT = "const done = arguments[arguments.length - 1]; Promise.resolve(%s).then(done, String);"
# Chromium as a user has it: mDNS host candidates and no loopback (the drive_call flags without those two).
CHROMIUM_AS_SHIPPED = [
    f
    for f in CHROMIUM_FLAGS
    if f not in ("--allow-loopback-in-peer-connection", "--disable-features=WebRtcHideLocalIpsWithMdns")
]


def decoded_frames(poll: Any) -> int:
    return int(((poll or {}).get("viewed") or {}).get("video", {}).get("framesDecoded") or 0)


class PagePolls:
    """The page's polls until ``seconds`` after its first decoded frame (or an error, or a deadline)."""

    def __init__(self, seconds: float, timeout_s: float = 40.0) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds + timeout_s
        self.first: float | None = None
        self.polls: list[Any] = []

    def add(self, poll: Any) -> bool:
        """Keep ``poll``; whether polling is done."""
        self.polls.append(poll)
        now = time.monotonic()
        if self.first is None and decoded_frames(poll) > 0:
            self.first = now
        if poll and poll.get("errors"):
            return True
        return now > self.deadline or (self.first is not None and now - self.first > self.seconds + 0.3)


def page_url(server: Server) -> str:
    """The whip-whep page, on 127.0.0.1 (a secure context, which getUserMedia needs)."""
    query = f"?token={server.token}" if server.token else ""
    return f"http://127.0.0.1:{server.port}/interop/whip_whep_page.html{query}"


async def chromium(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """The page publishes its fake microphone (WHIP) and watches the session (WHEP), both trickling."""
    devtools_port = free_port()
    proc, profile = launch_browser(args.chromium, page_url(server), devtools_port, flags=CHROMIUM_AS_SHIPPED)
    polls = PagePolls(args.seconds)
    try:
        async with aiohttp.ClientSession() as http:
            ws_url = await page_socket(http, devtools_port, time.monotonic() + 30)
            async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                tools = DevTools(ws)
                publishing = asyncio.ensure_future(observe_publisher(server, args.seconds))
                while True:
                    if polls.add(await tools.evaluate(PAGE_POLL)):
                        break
                    await asyncio.sleep(0.2)
                seen = await publishing
                await tools.evaluate(PAGE_STOP)
                await asyncio.sleep(0.5)
    finally:
        stop_browser(proc, profile)
    return {"server": seen, "polls": polls.polls}


# Firefox ESR through Marionette: a fake microphone without asking, and its own ICE defaults: host candidates
# named by mDNS, gathered on the interface of the default route (the test's namespace has one).
FIREFOX_PREFS = {
    "media.navigator.streams.fake": True,
    "media.navigator.permission.disabled": True,
    "media.autoplay.default": 0,
}


def firefox_polls(args: argparse.Namespace, url: str) -> tuple[list[Any], str]:
    """Open ``url`` in headless Firefox and poll it (Marionette is blocking: run in a thread)."""
    from marionette_driver.marionette import Marionette

    client = Marionette(
        host="127.0.0.1",
        port=free_port(),
        bin=shutil.which(args.firefox) or args.firefox,
        app="fxdesktop",
        headless=True,
        prefs=FIREFOX_PREFS,
        gecko_log=os.devnull,  # not gecko.log in the working directory
    )
    polls = PagePolls(args.seconds)
    try:
        client.start_session()
        version = str(client.session_capabilities.get("browserVersion"))
        client.navigate(url)
        while not polls.add(client.execute_async_script(ASYNC_SCRIPT % PAGE_POLL, sandbox=None)):
            time.sleep(0.2)
        client.execute_async_script(ASYNC_SCRIPT % PAGE_STOP, sandbox=None)
        time.sleep(0.5)
    finally:
        client.cleanup()
    return polls.polls, version


async def firefox(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """The same page as :func:`chromium` in Firefox ESR."""
    publishing = asyncio.ensure_future(observe_publisher(server, args.seconds))
    polls, version = await asyncio.to_thread(firefox_polls, args, page_url(server))
    return {"server": await publishing, "polls": polls, "firefox": version}


CLIENTS: dict[str, Callable[[Server, argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "gst-whip": gst_whip,
    "gst-whep": gst_whep,
    "obs": obs,
    "chromium": chromium,
    "firefox": firefox,
}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = Server(args.address, args.token)
    static = (
        {"/interop/node_modules/": NODE_MODULES, "/interop/": HERE / "page"}
        if args.client in ("chromium", "firefox")
        else {}
    )
    await server.start(static)
    try:
        result = await CLIENTS[args.client](server, args)
    finally:
        await server.stop()
    return {"client": args.client, "requests": server.requests, **result}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("client", choices=sorted(CLIENTS))
    parser.add_argument("--address", default="127.0.0.1", help="the server's address and its only ICE host")
    parser.add_argument("--token")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--end-of-candidates", action="store_true", help="obs: the offer ends its candidates")
    parser.add_argument("--chromium", default="chromium")
    parser.add_argument("--firefox", default="firefox-esr")
    parser.add_argument(
        "--setup", choices=("actpass", "passive"), default="actpass", help="gst-whep's a=setup"
    )
    args = parser.parse_args()
    result = asyncio.run(run(args))
    json.dump(result, sys.stdout, default=str)
    print(file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
