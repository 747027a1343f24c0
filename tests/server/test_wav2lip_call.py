"""An end-to-end call with the Wav2Lip backend (random weights) on the CPU keeps 25 fps.

Wav2Lip needs ~4 GMAC a frame: two CPU cores render it at about real time in batches of 8 when nothing else
runs, and fall behind when something does. The call must still deliver 25 fps of video with all of its
audio: frames the engine cannot finish in time are repeated, never waited for, and the engine drops work
whose deadline passed instead of queueing it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.wav2lip.model import Wav2Lip
from server.app import create_app
from server.config import Settings
from server.probe import report
from server.probe.client import call
from server.state import RUNTIME
from tests.fakes import speech_pattern, to_int16

pytestmark = [pytest.mark.usefixtures("loopback_ice"), pytest.mark.slow]

PATTERN = [("silence", 1.0), ("speech", 1.5), ("silence", 1.0), ("speech", 1.5), ("silence", 1.0)]


@pytest.fixture(scope="module")
def random_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("w2l") / "random_wav2lip.pth"
    torch.manual_seed(0)
    torch.save({"state_dict": Wav2Lip().state_dict(), "global_step": 0}, path)
    return path


async def test_wav2lip_call_on_cpu_delivers_25_fps(aiohttp_client, random_checkpoint: Path) -> None:
    settings = Settings(backend="wav2lip", checkpoint=random_checkpoint, device="cpu")
    client = await aiohttp_client(create_app(settings))
    runtime = client.app[RUNTIME]
    assert runtime.settings.render_budget_ms == 400.0  # the CPU needs time to batch
    sent = to_int16(speech_pattern(PATTERN))
    recording = await call(str(client.make_url("")).rstrip("/"), sent, tail_s=0.8, http=client.session)
    result = report.analyse(recording)
    assert result.fps >= 24.0, result.fps
    frames = [m for _, m in recording.meta]
    active = [m for m in frames if m["active"]]
    assert len(active) >= 50  # both bursts were rendered
    stats = runtime.engine.stats
    # Every speaking frame reached the engine and was either rendered or dropped at its deadline.
    assert stats.frames + stats.expired >= len(active) - 2, (stats, len(active))
    assert stats.frames >= 0.5 * len(active) and stats.failed_batches == 0, stats
    on_time = sum(1 for m in active if not m["late"])
    assert on_time > 0, "no rendered frame arrived in time"
    assert result.audio_returned >= 0.99 and result.freezes == 0
