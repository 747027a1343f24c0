"""A real aiortc client calls the in-process server on loopback: speech in, avatar and voice out."""

from __future__ import annotations

import numpy as np
import pytest

from lipcast.probe import analysis
from lipcast.probe.client import call
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from tests.fakes import speech_pattern, to_int16

pytestmark = [pytest.mark.usefixtures("loopback_ice"), pytest.mark.slow]

OPUS_DELAY_SAMPLES = 312
PATTERN = [
    ("silence", 1.2),
    ("speech", 0.7),
    ("silence", 0.8),
    ("speech", 1.0),
    ("silence", 0.9),
    ("speech", 0.5),
    ("silence", 1.0),
]


async def test_call_returns_lip_synced_avatar_and_the_callers_voice(aiohttp_client) -> None:
    settings = Settings()
    client = await aiohttp_client(create_app(settings))
    sent = to_int16(speech_pattern(PATTERN))
    recording = await call(str(client.make_url("")).rstrip("/"), sent, tail_s=1.0, http=client.session)
    runtime = client.app[RUNTIME]

    # Video: paced by the media clock over at least 5 s, in order. The band is wide enough for a busy machine
    # (a stalled event loop skips frames rather than queueing them) and still catches a pacing error: half
    # or double the rate, or frames that wait for something.
    arrived = np.asarray(recording.video.arrived_at)
    assert arrived[-1] - arrived[0] >= 5.0
    fps = analysis.received_fps(recording.video.arrived_at)
    print(f"end to end: fps {fps:.2f}")
    assert 20.0 <= fps <= 26.0, fps
    assert np.all(np.diff(recording.video.pts) > 0), "frames out of order"

    # Audio: every sent burst comes back whole and in order. The lag may step (the jitter buffer plays silence
    # while dry, as on a busy machine, and trims silence when it holds too much); the audio itself is never
    # cut, stretched or reordered.
    received = recording.audio.samples()
    bursts = analysis.detect_bursts(sent)
    assert len(bursts) == 3
    lag, _ = analysis.align(sent, received)
    lags = [g for g, _ in analysis.burst_lags(sent, received, bursts, lag)]
    fraction, checked, reordered, first_lags = analysis.returned_by_burst(sent, received, bursts, lags)
    assert checked > 50 and fraction >= 0.99 and reordered == 0, (fraction, checked, reordered)
    # Where each burst begins, the lag is the server's delay for the tick that carried its first sample
    # (jitter buffer + lookahead + render budget, exactly: the metadata says which input sample each tick
    # carried) plus libopus's 312-sample (6.5 ms) algorithmic delay once per direction.
    carried = sorted(
        (round(m["audio_ms"] * 48), m["frame"]) for _, m in recording.meta if m["audio_ms"] is not None
    )
    for burst, burst_lag in zip(bursts, first_lags, strict=True):
        input_pos, frame = max((c for c in carried if c[0] <= burst.start), default=(None, None))
        assert burst_lag is not None and input_pos is not None and burst.start - input_pos < 1920
        server_lag = frame * 1920 - input_pos
        assert abs(burst_lag - (server_lag + 2 * OPUS_DELAY_SAMPLES)) <= 48, (burst_lag, server_lag)

    # Mouth: moves during speech, still during silence.
    motion = analysis.mouth_motion(recording)
    meta = {m["frame"]: m for _, m in recording.meta}
    first_frame = recording.meta[0][1]["frame"]
    speech_motion, silence_motion = [], []
    for i, pts in enumerate(recording.video.pts):
        m = meta.get(first_frame + pts // 3600)
        if m is None or m["audio_ms"] is None:
            continue
        position = m["audio_ms"] * 48
        inside = [b for b in bursts if b.start + 4800 <= position <= b.end - 4800]
        quiet = all(position < b.start - 2400 or position > b.end + 24000 for b in bursts)
        if inside:
            speech_motion.append(motion[i])
        elif quiet:
            silence_motion.append(motion[i])
    assert len(speech_motion) > 20 and len(silence_motion) > 20
    assert np.median(speech_motion) > 4.0 * (np.max(silence_motion) + 0.5), (
        np.median(speech_motion),
        np.max(silence_motion),
    )

    stats = runtime.engine.stats
    assert stats.frames > 0 and stats.failed_batches == 0
