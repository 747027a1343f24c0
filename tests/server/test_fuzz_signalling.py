"""Property-based fuzzing of the signalling endpoints: well over a thousand malformed requests (JSON, SDP,
headers, sizes) get only 4xx answers, and the server stays healthy and holds nothing afterwards."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from lipcast.streaming.rtc import restrict_host_addresses

pytestmark = pytest.mark.slow
EXAMPLES = 1200

VALID_SDP = (
    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendrecv\r\n"
    "a=rtpmap:111 opus/48000/2\r\na=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\na=setup:actpass\r\n"
    "m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\na=recvonly\r\n"
    "a=rtpmap:96 VP8/90000\r\na=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\na=setup:actpass\r\n"
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def broken_sdp(draw: st.DrawFn) -> str:
    """SDP that must not parse into a usable offer: cut, with lines dropped, or with garbage spliced in."""
    lines = VALID_SDP.split("\r\n")
    how = draw(st.sampled_from(["cut", "drop_m", "garbage", "no_version", "text"]))
    if how == "cut":
        return VALID_SDP[: draw(st.integers(0, 60))]
    if how == "drop_m":
        return "\r\n".join(line for line in lines if not line.startswith("m="))
    if how == "garbage":
        at = draw(st.integers(0, len(lines) - 1))
        return "\r\n".join([*lines[:at], "m=" + draw(st.text(max_size=30)), *lines[at:]])
    if how == "no_version":
        return "\r\n".join(lines[1:])
    return draw(st.text(max_size=200))


@st.composite
def offer_requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bytes]:
    kind = draw(st.sampled_from(["json_value", "bytes", "bad_fields", "bad_sdp", "huge", "headers"]))
    headers = {
        "Content-Type": draw(st.sampled_from(["application/json", "text/plain", "application/sdp", ""]))
    }
    if kind == "json_value":
        body = json.dumps(draw(json_values)).encode()
    elif kind == "bytes":
        body = draw(st.binary(max_size=300))
    elif kind == "bad_fields":
        fields = {"sdp": draw(json_values), "type": draw(json_values), "avatar": draw(json_values)}
        body = json.dumps({k: v for k, v in fields.items() if draw(st.booleans())}).encode()
    elif kind == "bad_sdp":
        body = json.dumps({"sdp": draw(broken_sdp()), "type": "offer"}).encode()
    elif kind == "huge":
        body = b"{" + b" " * draw(st.sampled_from([70_000, (1 << 20) + 10])) + b"}"
    else:
        headers["X-" + draw(st.text("abcdefgh", min_size=1, max_size=8))] = draw(
            st.text("abc xyz", max_size=200)
        )
        body = json.dumps({"sdp": draw(broken_sdp()), "type": "offer"}).encode()
    return "POST", "/offer", headers, body


@st.composite
def whip_whep_requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bytes]:
    path = draw(st.sampled_from(["/whip", "/whep/nope", "/whip/nope", "/whep/x/viewers/y"]))
    method = "POST" if path in ("/whip", "/whep/nope") else draw(st.sampled_from(["DELETE", "GET", "POST"]))
    content_type = draw(st.sampled_from(["application/sdp", "application/json", "text/plain", ""]))
    body = draw(broken_sdp()).encode() if draw(st.booleans()) else draw(st.binary(max_size=200))
    headers = {"Content-Type": content_type}
    if draw(st.booleans()):
        headers["Authorization"] = draw(st.sampled_from(["Bearer", "Bearer x", "Basic abc", "bearer  "]))
    return method, path + draw(st.sampled_from(["", "?avatar=nobody", "?avatar=../../etc"])), headers, body


@st.composite
def session_requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bytes]:
    session = draw(st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=24))
    return draw(st.sampled_from(["DELETE", "GET"])), f"/sessions/{session}", {}, b""


requests = offer_requests() | whip_whep_requests() | session_requests()


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, web.Application]]:
    """The app on a real port in a thread of its own, so hypothesis can drive it synchronously."""
    restore = restrict_host_addresses(["127.0.0.1"])
    loop = asyncio.new_event_loop()
    app = create_app(Settings(max_sessions=64, connect_timeout_s=2))
    runner = web.AppRunner(app)
    started = threading.Event()
    port: list[int] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60)
    yield f"http://127.0.0.1:{port[0]}", app
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    restore()


def send(url: str, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url + path, data=body or None, method=method)
    for name, value in headers.items():
        if value:
            request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_malformed_signalling_gets_only_4xx(server: tuple[str, web.Application]) -> None:
    url, app = server
    statuses: Counter[int] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(requests)
    def check(request: tuple[str, str, dict[str, str], bytes]) -> None:
        method, path, headers, body = request
        status, payload = send(url, method, path, headers, body)
        statuses[status] += 1
        assert 400 <= status < 500, (status, method, path, headers, body[:200], payload[:300])

    check()
    total = sum(statuses.values())
    print(f"fuzz: {total} requests, statuses {dict(sorted(statuses.items()))}")
    assert total >= 1000
    runtime = app[RUNTIME]
    assert runtime.sessions.sessions == {} and len(runtime.sessions) == 0
    assert send(url, "GET", "/healthz", {}, b"")[0] == 200
    assert send(url, "GET", "/readyz", {}, b"")[0] == 200
