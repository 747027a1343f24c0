"""Push sessions: audio over a WebSocket, watched by a real aiortc WHEP viewer on loopback; interrupt;
bad input."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestClient

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ
from lipcast.probe import analysis
from lipcast.probe.push_client import PushClient, create_push_session, open_push
from lipcast.probe.wish import Peer, open_viewer
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from tests.fakes import speech_pattern, to_int16

pytestmark = pytest.mark.usefixtures("loopback_ice")

RATE_HZ = MEDIA_SAMPLE_RATE_HZ
PATTERN = [("silence", 0.6), ("speech", 0.8), ("silence", 0.9), ("speech", 0.8), ("silence", 1.0)]


def base_url(client: TestClient) -> str:
    return str(client.make_url("")).rstrip("/")


async def watch(client: TestClient, session_id: str) -> Peer:
    viewer = await open_viewer(client.session, base_url(client), session_id)
    await viewer.wait_connected()
    return viewer


async def wait_for(condition, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def motion_by_frame(viewer: Peer) -> dict[int, float]:
    regions = viewer.frame_regions()
    frames = sorted(regions)
    rest = np.median(np.stack([regions[f] for f in frames[:5]]).astype(np.float64), axis=0)
    return {f: float(np.abs(regions[f].astype(np.float64) - rest).mean()) for f in frames}


@pytest.mark.slow
async def test_pushed_audio_comes_back_at_real_time_with_the_mouth(aiohttp_client) -> None:
    """A TTS-like burst pushed 10x faster than real time plays out at real time, all of it, in order, and
    the mouth moves in its speech and rests in its silences."""
    client = await aiohttp_client(create_app(Settings()))
    push = await open_push(client.session, base_url(client), RATE_HZ)
    viewer = await watch(client, push.session_id)
    sent = to_int16(speech_pattern(PATTERN))
    duration_s = len(sent) / RATE_HZ
    try:
        await asyncio.sleep(0.5)  # the viewer's first frames: the avatar at rest
        # Odd byte counts on the wire: split every chunk's bytes unevenly.
        pushed_at = time.monotonic()
        await push.send_paced(sent, RATE_HZ, speedup=10.0, chunk_ms=100.0)
        push_span_s = time.monotonic() - pushed_at
        await push.control("end_of_speech")
        await push.wait_reply("flushed")
        session = client.app[RUNTIME].sessions.get(push.session_id)
        await wait_for(lambda: session.buffer.depth_samples == 0, duration_s + 10)
        await asyncio.sleep(1.0)  # the delay line and the network
        assert not [r for _, r in push.replies if r["type"] == "error"]
    finally:
        await viewer.close()
        await push.close()
    assert push_span_s < duration_s / 3, push_span_s  # it really was pushed much faster than real time

    received = viewer.audio.samples()
    bursts = analysis.detect_bursts(sent)
    assert len(bursts) == 2
    lag, _ = analysis.align(sent, received)
    lags = analysis.burst_lags(sent, received, bursts, lag)
    fraction, checked, reordered, _ = analysis.returned_by_burst(sent, received, bursts, [x for x, _ in lags])
    print(f"push: returned {fraction:.3f} of {checked} blocks, lags {lags}")
    assert checked > 50 and fraction >= 0.99 and reordered == 0, (fraction, checked, reordered)

    # Real time: the voice's arrival spans its own duration, not a tenth of it.
    first = analysis.received_time_of(viewer.audio, bursts[0].start + lags[0][0])
    last = analysis.received_time_of(viewer.audio, bursts[-1].end + lags[-1][0])
    assert first is not None and last is not None
    span_s, expected_s = last - first, (bursts[-1].end - bursts[0].start) / RATE_HZ
    print(f"push: voice arrived over {span_s:.2f} s for {expected_s:.2f} s of audio")
    assert 0.85 * expected_s <= span_s <= 1.25 * expected_s, (span_s, expected_s)

    # The mouth: moving in speech, at rest in silence (metadata and pixels).
    motion = motion_by_frame(viewer)
    meta = {m["frame"]: m for _, m in viewer.meta}
    speech, silence = [], []
    for frame, moved in motion.items():
        m = meta.get(frame)
        if m is None or m["audio_ms"] is None:
            continue
        position = m["audio_ms"] * 48
        if any(b.start + 4800 <= position <= b.end - 4800 for b in bursts):
            speech.append((moved, m["active"]))
        elif all(position < b.start - 2400 or position > b.end + 24000 for b in bursts):
            silence.append((moved, m["active"]))
    assert len(speech) > 20 and len(silence) > 5, (len(speech), len(silence))
    assert all(active for _, active in speech) and not any(active for _, active in silence)
    speech_motion = np.median([x for x, _ in speech])
    assert speech_motion > 4.0 * (max(x for x, _ in silence) + 0.5), (speech_motion, silence)


@pytest.mark.slow
async def test_interrupt_silences_voice_and_mouth_within_two_frames(aiohttp_client) -> None:
    """Interrupt mid-utterance (most of it still queued): no frame from the interrupt's tick + 2 on carries
    pushed audio or a rendered mouth; the returned voice stops; the session then speaks again."""
    client = await aiohttp_client(create_app(Settings()))
    push = await open_push(client.session, base_url(client), RATE_HZ)
    viewer = await watch(client, push.session_id)
    utterance = to_int16(speech_pattern([("speech", 4.0)]))
    again = to_int16(speech_pattern([("speech", 0.8), ("silence", 0.6)], seed=3))
    try:
        await asyncio.sleep(0.4)
        await push.send_paced(utterance, RATE_HZ, speedup=20.0)
        session = client.app[RUNTIME].sessions.get(push.session_id)
        await wait_for(lambda: session.buffer.stats.pulled_samples > RATE_HZ)  # 1 s of it has played
        await asyncio.sleep(0.2)
        replies = len(push.replies)
        await push.control("interrupt")
        interrupted = (await push.wait_reply("interrupted", after=replies))["frame"]
        assert session.buffer.depth_samples == 0
        await asyncio.sleep(1.5)
        # Usable afterwards: a new utterance plays.
        await push.send_paced(again, RATE_HZ, speedup=10.0)
        await push.control("end_of_speech")
        await asyncio.sleep(2.0)
    finally:
        await viewer.close()
        await push.close()

    meta = {m["frame"]: m for _, m in viewer.meta}
    before = [meta[f] for f in range(interrupted - 10, interrupted) if f in meta]
    assert before and all(m["active"] and m["audio_ms"] is not None for m in before), before
    after = [meta[f] for f in range(interrupted + 2, interrupted + 30) if f in meta]
    assert len(after) >= 20, len(after)
    assert not any(m["active"] or m["speech"] or m["audio_ms"] is not None for m in after), after
    # Pixels: the mouth region of those frames is the resting mouth.
    motion = motion_by_frame(viewer)
    moving_before = np.median([motion[f] for f in range(interrupted - 10, interrupted) if f in motion])
    resting_after = max(motion[f] for f in range(interrupted + 2, interrupted + 30) if f in motion)
    assert moving_before > 4.0 * (resting_after + 0.5), (moving_before, resting_after)
    # The voice: silent in the received audio from that frame's arrival on (until the next utterance).
    arrivals = viewer.frame_arrivals()
    t_rest = arrivals[interrupted + 2]
    t_until = arrivals[interrupted + 30]
    audio = viewer.audio
    quiet = [
        chunk
        for chunk, at in zip(audio.chunks, audio.arrived_at, strict=True)
        if t_rest + 0.08 <= at <= t_until
    ]
    assert quiet
    level = np.sqrt(np.mean(np.concatenate(quiet).astype(np.float64) ** 2))
    assert level < 100.0, level
    resumed = [m for m in meta.values() if m["frame"] > interrupted + 30 and m["active"]]
    assert len(resumed) > 10


@pytest.fixture
async def small(aiohttp_client) -> TestClient:
    settings = Settings(max_sessions=1, push_buffer_s=1.0, push_grace_s=0.5, auth_token="secret")
    return await aiohttp_client(create_app(settings))


AUTH = {"Authorization": "Bearer secret"}


async def test_push_session_refuses_bad_requests(small: TestClient) -> None:
    url = base_url(small)
    for body, status in (
        ({"sample_rate_hz": 7999}, 400),
        ({"sample_rate_hz": 48001}, 400),
        ({"sample_rate_hz": "16000"}, 400),
        ({}, 400),
        ({"sample_rate_hz": 16000, "channels": 2}, 400),
        ({"sample_rate_hz": 16000, "encoding": "opus"}, 400),
        ({"sample_rate_hz": 16000, "avatar": "nobody"}, 404),
    ):
        async with small.session.post(f"{url}/sessions", json=body, headers=AUTH) as r:
            assert r.status == status, (body, r.status)
            assert "error" in await r.json()
    async with small.session.post(f"{url}/sessions", json={"sample_rate_hz": 16000}) as r:
        assert r.status == 401
    async with small.session.post(f"{url}/sessions", data=b"{nope", headers=AUTH) as r:
        assert r.status == 400
    assert not small.app[RUNTIME].sessions.sessions

    info = await create_push_session(small.session, url, 16000, token="secret")
    assert info["audio_url"].endswith(f"/sessions/{info['session_id']}/audio")
    assert info["whep_url"].endswith(f"/whep/{info['session_id']}")
    assert f"session={info['session_id']}" in info["viewer_url"]
    # The shared session cap.
    async with small.session.post(f"{url}/sessions", json={"sample_rate_hz": 16000}, headers=AUTH) as r:
        assert r.status == 503 and r.headers["Retry-After"]
    # A socket without the token is refused; DELETE ends the session.
    with pytest.raises(aiohttp.WSServerHandshakeError):
        await small.session.ws_connect(info["audio_url"])
    async with small.session.delete(f"{url}/sessions/{info['session_id']}", headers=AUTH) as r:
        assert r.status == 204
    assert not small.app[RUNTIME].sessions.sessions


async def test_bad_socket_input_gets_an_error_and_the_session_stays_usable(small: TestClient) -> None:
    push = await open_push(small.session, base_url(small), 16000, token="secret")
    session = small.app[RUNTIME].sessions.get(push.session_id)
    try:
        await push.socket.send_str("not json")
        assert (await push.wait_reply("error"))["code"] == "bad_json"
        await push.socket.send_str('{"type": "sing"}')
        assert (await push.wait_reply("error", after=1))["code"] == "unknown_message"
        # A second socket on the same session is refused.
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await small.session.ws_connect(push.info["audio_url"], headers=AUTH)
        assert refused.value.status == 409
        # Odd byte counts: 3 bytes then 1 byte make two samples.
        await push.socket.send_bytes(b"\x01\x00\x02")
        await push.socket.send_bytes(b"\x00")
        await wait_for(lambda: session.push.received_bytes == 4)
        # More than the 1 s bound in one message: refused whole, nothing queued, nothing dropped.
        queued = session.buffer.stats.pushed_samples
        await push.socket.send_bytes(np.ones(16000 * 2, np.int16).tobytes())
        error = await push.wait_reply("error", after=2)
        assert error["code"] == "buffer_full" and "bound" in error["message"]
        assert session.buffer.stats.pushed_samples == queued
        assert session.push.refused_bytes == 16000 * 4
        # Still usable: half a second fits.
        await push.socket.send_bytes(np.ones(8000, np.int16).tobytes())
        await wait_for(lambda: session.buffer.stats.pushed_samples >= queued + 23000)
        assert not session.closed.is_set()
        async with small.session.get(f"{base_url(small)}/metrics") as r:
            text = await r.text()
        assert "lipcast_push_bytes_refused_total 64000" in text
        await push.control("close")
        await asyncio.wait_for(session.closed.wait(), 5)
    finally:
        await push.close(delete=False)
    assert not small.app[RUNTIME].sessions.sessions


async def test_push_session_closes_when_its_socket_is_gone(small: TestClient) -> None:
    push: PushClient = await open_push(small.session, base_url(small), 16000, token="secret")
    session = small.app[RUNTIME].sessions.get(push.session_id)
    await push.close(delete=False)
    await asyncio.wait_for(session.closed.wait(), 5)  # after the 0.5 s grace period
    assert not small.app[RUNTIME].sessions.sessions
