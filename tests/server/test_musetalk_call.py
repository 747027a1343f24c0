"""A call through the server with a tiny random MuseTalk on the CPU: audio in, lip-synced video out at the
media clock's rate, every speaking frame rendered or dropped at its deadline (as the Wav2Lip call test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lipcast.probe import report
from lipcast.probe.client import call
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from tests.fakes import speech_pattern, to_int16
from tests.pipeline.musetalk_fixtures import tiny_checkpoint
from tests.server.call_checks import check_paced_call

pytestmark = [pytest.mark.usefixtures("loopback_ice"), pytest.mark.slow]

PATTERN = [("silence", 1.0), ("speech", 1.5), ("silence", 1.0), ("speech", 1.5), ("silence", 1.0)]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("musetalk"))


def cpu_settings(weights: Path, **extra: Any) -> Settings:
    """A MuseTalk server on the CPU with the tiny random weights (small batches, a lenient budget)."""
    return Settings(
        backend="musetalk",
        musetalk_weights=weights,
        device="cpu",
        torch_threads=1,
        render_budget_ms=1000,
        batch_sizes=(1, 2, 4),
        **extra,
    )


async def test_musetalk_call_on_cpu(aiohttp_client, weights: Path) -> None:
    client = await aiohttp_client(create_app(cpu_settings(weights)))
    runtime = client.app[RUNTIME]
    assert runtime.backend.name == "musetalk" and runtime.backend.lookahead_ms == 80.0
    sent = to_int16(speech_pattern(PATTERN))
    recording = await call(str(client.make_url("")).rstrip("/"), sent, tail_s=1.5, http=client.session)
    result = report.analyse(recording)
    frames = [m for _, m in recording.meta]
    active = [m for m in frames if m["active"]]
    stats = runtime.engine.stats
    print(f"musetalk on CPU: fps {result.fps:.2f}, {len(active)} speaking frames; {stats}")
    await check_paced_call(recording, result, runtime)


async def test_an_uploaded_avatar_is_listed_and_renders_with_musetalk(
    aiohttp_client, weights: Path, tmp_path: Path
) -> None:
    from tests.pipeline.face_media import drawn_face_frames, encode_video
    from tests.server.test_avatar_uploads import finished, form

    settings = cpu_settings(weights, upload_dir=tmp_path / "uploads")
    client = await aiohttp_client(create_app(settings))
    video = encode_video(tmp_path / "drawn.mp4", drawn_face_frames(10))
    async with client.post("/avatars", data=form("drawn", video)) as response:
        assert response.status == 202, await response.text()
        job = await finished(client, await response.json())
    assert job["state"] == "done", job
    async with client.get("/avatars") as response:
        names = {a["name"] for a in (await response.json())["avatars"]}
    assert names == {"astronaut", "drawn"}
    audio = to_int16(speech_pattern([("silence", 0.3), ("speech", 0.8), ("silence", 0.4)]))
    recording = await call(
        str(client.make_url("")).rstrip("/"), audio, avatar="drawn", tail_s=0.5, http=client.session
    )
    assert recording.avatar["name"] == "drawn" and recording.video.size == (160, 160)
    engine = client.app[RUNTIME].engine
    assert engine.stats.frames > 0 and engine.stats.failed_batches == 0
