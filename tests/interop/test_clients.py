"""WHIP and WHEP clients that others wrote, against lipcast, each sending or receiving real media for 10 s:
GStreamer's webrtcbin as a WHIP source (trickling its candidates by PATCH) and as a WHEP viewer (both DTLS
roles, with its RSA certificate), libdatachannel sending OBS's offer (no candidates, with and without
``a=end-of-candidates``), and the npm package whip-whep in Chromium (WHIP and WHEP, trickling). With and
without a bearer token.

Each runs in a network namespace of its own with a LAN address (a veth pair: libnice and libjuice ignore
loopback, and libnice interfaces named veth*), lipcast and the client inside it (tests/interop/drive.py).
The clients are installed by .ci/install-test-packages (Debian's GStreamer) and ``make test`` (``npm ci`` in
tests/interop); a client that is missing skips its test, saying how to install it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.drive import NODE_MODULES, SYSTEM_PYTHON
from tests.system import CHROMIUM, INSTALL_HINT, in_netns, needs_chromium, needs_netns

ROOT = Path(__file__).resolve().parents[2]
LAN_ADDRESS, PEER_ADDRESS = "10.231.0.1", "10.231.0.2"
SECONDS = 10.0
TOKEN = "interop-token"
FPS = 25
AUDIO_HZ = 48_000
MIN_FPS = 24.0  # the gate: >= 24 of 25 fps decoded over 10 s
MIN_AUDIO = 0.95  # >= 95 % of the audio back


def gstreamer_ready() -> bool:
    probe = (
        "import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstWebRTC', '1.0');"
        "from gi.repository import Gst, GstWebRTC; Gst.init(None);"
        "assert all(Gst.ElementFactory.find(e) for e in ('webrtcbin', 'nicesrc', 'vp8dec', 'opusenc'))"
    )
    try:
        return subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_gstreamer = pytest.mark.skipif(
    not gstreamer_ready(),
    reason="GStreamer webrtcbin is not installed (Debian gstreamer1.0-plugins-bad, gstreamer1.0-nice, "
    f"python3-gst-1.0, gir1.2-gst-plugins-bad-1.0) {INSTALL_HINT}",
)
needs_node_modules = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_MODULES / "node-datachannel").is_dir(),
    reason="node and tests/interop/node_modules are needed (`make test` runs npm ci in tests/interop)",
)
FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")
needs_firefox = pytest.mark.skipif(
    FIREFOX is None or importlib.util.find_spec("marionette_driver") is None,
    reason=f"Firefox ESR and marionette-driver are needed (Debian firefox-esr) {INSTALL_HINT}",
)
needs_whip_whep = pytest.mark.skipif(
    not (NODE_MODULES / "whip-whep" / "whip.js").is_file(),
    reason="the npm package whip-whep is not installed (`make test` runs npm ci in tests/interop)",
)

pytestmark = [pytest.mark.slow, needs_netns]


@pytest.fixture
def lan(netns: str) -> Iterator[str]:
    """The namespace with a LAN of two addresses (lipcast serves on the first)."""
    for command in (
        "ip link add lan0 type veth peer name lan1",
        f"ip addr add {LAN_ADDRESS}/24 dev lan0",
        f"ip addr add {PEER_ADDRESS}/24 dev lan1",
        "ip link set lan0 up",
        "ip link set lan1 up",
        f"ip route add default via {PEER_ADDRESS} dev lan0",  # Firefox gathers on the default route's link
    ):
        subprocess.run(["ip", "netns", "exec", netns, *command.split()], check=True)
    yield netns


def drive(netns: str, client: str, *args: str, token: str | None = None) -> dict[str, Any]:
    command = in_netns(
        netns, "tests.interop.drive", client, "--address", LAN_ADDRESS, "--seconds", str(SECONDS)
    )
    command += [*args, *(["--token", token] if token else [])]
    if client == "chromium":
        command += ["--chromium", str(CHROMIUM)]
    if client == "firefox":
        command += ["--firefox", str(FIREFOX)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, Any] = json.loads(run.stdout)
    print(json.dumps({k: v for k, v in result.items() if k != "polls"}, default=str)[:4000])
    return result


def requests_of(result: dict[str, Any], method: str) -> list[dict[str, Any]]:
    return [r for r in result["requests"] if r["method"] == method]


def assert_heard(server: dict[str, Any]) -> None:
    """The WHIP session connected and lipcast decoded >= 95 % of the 50 audio frames a second."""
    assert server.get("connection") == "connected", server
    assert server["audio_fps"] >= MIN_AUDIO * 50, server


def assert_authorized(result: dict[str, Any], token: str | None) -> None:
    api = [r for r in result["requests"] if r["path"].startswith(("/whip", "/whep"))]
    assert api and all(r["authorized"] == (token is not None) for r in api), api
    assert all(r["status"] != 401 for r in api), api


@needs_gstreamer
def test_gstreamer_whip_source_trickles_by_patch_and_is_heard(lan: str) -> None:
    result = drive(lan, "gst-whip")
    client, server = result["client"], result["server"]
    assert client["errors"] == [], client
    assert client["offer_candidates"] == 0 and client["content_type"] == "application/sdp"
    patches = requests_of(result, "PATCH")
    assert patches and all(p["status"] == 204 for p in patches), patches
    assert sum(p["candidates"] for p in patches) > 0
    assert all(p["if_match"] and p["content_type"] == "application/trickle-ice-sdpfrag" for p in patches)
    assert_heard(server)
    assert "host" in server["remote_candidate_types"]  # the trickled candidates, not only peer-reflexive
    assert server["video_packets_dropped"] > 100  # its VP8 arrives (answered recvonly) and is dropped
    assert client["delete"] == 200 and result["sessions_left"] == 0


@needs_gstreamer
@pytest.mark.parametrize("setup, answered", [("actpass", "passive"), ("passive", "active")])
def test_gstreamer_whep_viewer_decodes_25_fps_and_the_audio(lan: str, setup: str, answered: str) -> None:
    """GStreamer's RSA certificate either way: lipcast DTLS server (actpass offer) or client (passive)."""
    result = drive(lan, "gst-whep", "--setup", setup, token=TOKEN)
    viewer = result["viewer"]
    assert viewer["errors"] == [], viewer
    assert viewer["status"] == 201 and viewer["content_type"] == "application/sdp"
    assert viewer["answer_setup"] == [answered]
    frames = [t for t in viewer["frames"] if t <= SECONDS]
    fps, audio = len(frames) / SECONDS, viewer["audio_samples"] / (AUDIO_HZ * SECONDS)
    print(f"gstreamer whep ({setup}): {fps:.2f} fps decoded, {audio:.3f} of the audio")
    assert fps >= MIN_FPS and audio >= MIN_AUDIO
    assert_authorized(result, TOKEN)


@needs_node_modules
@pytest.mark.parametrize(
    "end_of_candidates, token", [(True, TOKEN), (False, None)], ids=["end-of-candidates", "open"]
)
def test_obs_shaped_offer_on_libdatachannel_connects_and_is_heard(
    lan: str, end_of_candidates: bool, token: str | None
) -> None:
    result = drive(lan, "obs", *(["--end-of-candidates"] if end_of_candidates else []), token=token)
    client, server = result["client"], result["server"]
    assert client["errors"] == [], client
    assert client["offer_candidates"] == 0 and client["offer_end_of_candidates"] == end_of_candidates
    assert client["answer_candidates"] > 0 and client["answer_setup"] == ["a=setup:passive"]
    assert_heard(server)
    assert server["remote_candidate_types"] == ["prflx"]
    assert client["delete"] == 200
    assert_authorized(result, token)


def window(polls: list[Any], seconds: float) -> tuple[float, float, float]:
    """(seconds, frames, audio samples) decoded from the first decoded frame over ``seconds``."""
    polls = [p for p in polls if p and (p.get("viewed") or {}).get("video")]
    started = next(p for p in polls if p["viewed"]["video"]["framesDecoded"] > 0)
    ended = next((p for p in polls if p["t"] - started["t"] >= seconds * 1000), polls[-1])
    elapsed = (ended["t"] - started["t"]) / 1000
    frames = ended["viewed"]["video"]["framesDecoded"] - started["viewed"]["video"]["framesDecoded"]
    samples = (
        ended["viewed"]["audio"]["totalSamplesReceived"] - started["viewed"]["audio"]["totalSamplesReceived"]
    )
    return elapsed, frames, samples


@needs_chromium
@needs_whip_whep
@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "open"])
def test_whip_whep_library_in_chromium_publishes_and_watches(lan: str, token: str | None) -> None:
    result = drive(lan, "chromium", token=token)
    last = result["polls"][-1]
    assert last and last["errors"] == [], last
    assert_heard(result["server"])
    patches = requests_of(result, "PATCH")
    assert {p["path"].count("/") for p in patches} == {2, 4}  # the WHIP session's and the viewer's
    assert all(p["status"] == 204 for p in patches), patches
    elapsed, frames, samples = window(result["polls"], SECONDS)
    fps, audio = frames / elapsed, samples / (AUDIO_HZ * elapsed)
    print(f"chromium whep: {fps:.2f} fps decoded, {audio:.3f} of the audio over {elapsed:.1f} s")
    assert elapsed >= SECONDS - 0.5 and fps >= MIN_FPS and audio >= MIN_AUDIO
    assert_authorized(result, token)


@needs_firefox
@needs_whip_whep
def test_whip_whep_library_in_firefox_connects_with_mdns_candidates(lan: str) -> None:
    """Firefox names its host candidates by mDNS and trickles them: lipcast resolves them off the answer's
    path (or learns peer-reflexive ones) and the page publishes and watches as in Chromium."""
    result = drive(lan, "firefox", token=TOKEN)
    last = result["polls"][-1]
    assert last and last["errors"] == [], last
    assert_heard(result["server"])
    patches = requests_of(result, "PATCH")
    assert patches and all(p["status"] == 204 for p in patches), patches
    print(
        f"firefox {result['firefox']}: {sum(p['mdns_candidates'] for p in patches)} mDNS candidates trickled"
    )
    elapsed, frames, samples = window(result["polls"], SECONDS)
    fps, audio = frames / elapsed, samples / (AUDIO_HZ * elapsed)
    print(f"firefox whep: {fps:.2f} fps decoded, {audio:.3f} of the audio over {elapsed:.1f} s")
    assert elapsed >= SECONDS - 0.5 and fps >= MIN_FPS and audio >= MIN_AUDIO
    assert_authorized(result, TOKEN)
