"""A real aiortc client calls the in-process server on loopback: speech in, avatar and voice out."""

from __future__ import annotations

import numpy as np
import pytest

from server.app import create_app
from server.config import Settings
from server.probe import analysis
from server.probe.client import call
from server.state import RUNTIME
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

    # Video: at least 24 frames/s over at least 5 s.
    arrived = np.asarray(recording.video.arrived_at)
    assert arrived[-1] - arrived[0] >= 5.0
    fps = analysis.received_fps(recording.video.arrived_at)
    assert fps >= 24.0, fps

    # Audio: every sent burst comes back, at one consistent delay.
    received = recording.audio.samples()
    lag, peak = analysis.align(sent, received)
    assert peak > 0.8, peak
    fraction, checked = analysis.returned_fraction(sent, received, lag)
    assert checked > 50 and fraction >= 0.99, (fraction, checked)
    # The lag is the server's fixed delay (jitter buffer + lookahead + render budget) plus libopus's
    # 312-sample (6.5 ms) algorithmic delay once per direction. The metadata says which input sample
    # each tick carried, so the server's part is known exactly.
    first_meta = next(m for _, m in recording.meta if m["audio_ms"] is not None)
    server_lag = first_meta["frame"] * 1920 - round(first_meta["audio_ms"] * 48)
    assert abs(lag - (server_lag + 2 * OPUS_DELAY_SAMPLES)) <= 48, (lag, server_lag)

    # Mouth: moves during speech, still during silence.
    motion = analysis.mouth_motion(recording)
    bursts = analysis.detect_bursts(sent)
    assert len(bursts) == 3
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
