"""face_enhance on the API: each bad request gets its status and message, leaves nothing behind, and the
server keeps taking calls; serve refuses unusable restorer settings at startup."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from aiohttp.test_utils import TestClient

from lipcast.pipeline.enhance.compact import random_compact_state
from lipcast.pipeline.enhance.weights import EnhanceUnavailableError, import_spandrel
from lipcast.pipeline.wav2lip.model import Wav2Lip
from lipcast.server.app import create_app
from lipcast.server.cli import face_enhance_problem
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from tests.server.test_signalling_errors import assert_nothing_left, client_offer, live_tasks

pytestmark = pytest.mark.usefixtures("loopback_ice")


def spandrel_missing() -> str | None:
    try:
        import_spandrel()
    except EnhanceUnavailableError as e:
        return str(e)
    return None


needs_spandrel = pytest.mark.skipif(spandrel_missing() is not None, reason=f"{spandrel_missing()}")


@pytest.fixture
async def builtin(aiohttp_client) -> TestClient:
    return await aiohttp_client(create_app(Settings(max_sessions=2, connect_timeout_s=5)))


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"face_enhance": "blur"}, "'face_enhance' must be one of off, sharpen"),
        ({"face_enhance": 1}, "'face_enhance' must be one of off, sharpen"),
        (
            {"face_enhance": "off", "face_enhance_strength": 1.2},
            "'face_enhance_strength' must be a number in [0, 1]",
        ),
        ({"face_enhance_strength": "loud"}, "'face_enhance_strength' must be a number in [0, 1]"),
    ],
)
async def test_bad_face_enhance_gets_400(builtin, extra, message) -> None:
    before = live_tasks()
    pc, body = await client_offer()
    response = await builtin.post("/offer", json=body | extra)
    assert response.status == 400
    assert message in (await response.json())["error"]
    await pc.close()
    await assert_nothing_left(builtin, before)


async def test_sharpen_without_restorer_is_refused_and_calls_go_on(builtin) -> None:
    before = live_tasks()
    pc, body = await client_offer()
    response = await builtin.post("/offer", json=body | {"face_enhance": "sharpen"})
    assert response.status == 409
    assert "--face-enhance-weights" in (await response.json())["error"]
    await pc.close()
    await assert_nothing_left(builtin, before)
    pc, body = await client_offer()  # the next call, off, is taken
    response = await builtin.post("/offer", json=body | {"face_enhance": "off"})
    assert response.status == 200
    health = await (await builtin.get("/healthz")).json()
    assert health["face_enhance"] == {"default": "off", "strength": 0.7, "sharpen": False}
    runtime = builtin.app[RUNTIME]
    (session,) = runtime.sessions.sessions.values()
    assert session.stream.enhance_strength == 0.0
    await session.close("test over")
    await pc.close()


async def test_whip_query_is_checked(builtin) -> None:
    before = live_tasks()
    pc, body = await client_offer(video=False)
    for query, status, message in (
        ("face_enhance=blur", 400, "'face_enhance' must be one of off, sharpen"),
        ("face_enhance_strength=2", 400, "'face_enhance_strength'"),
        ("face_enhance=sharpen", 409, "--face-enhance-weights"),
    ):
        response = await builtin.post(
            f"/whip?{query}", data=body["sdp"], headers={"Content-Type": "application/sdp"}
        )
        assert response.status == status, query
        assert message in (await response.json())["error"]
    await pc.close()
    await assert_nothing_left(builtin, before)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("enhance")
    torch.manual_seed(0)
    torch.save({"state_dict": Wav2Lip().state_dict()}, root / "wav2lip.pth")
    torch.save({"params": random_compact_state(num_feat=8, num_conv=2, seed=1)}, root / "restorer.pth")
    return root / "wav2lip.pth", root / "restorer.pth"


@needs_spandrel
async def test_sharpen_on_a_cpu_server(aiohttp_client, files) -> None:
    checkpoint, restorer = files
    settings = Settings(
        backend="wav2lip",
        checkpoint=checkpoint,
        device="cpu",
        torch_threads=1,
        batch_sizes=(1, 2),
        render_budget_ms=1000,
        face_enhance_weights=restorer,
        max_sessions=2,
    )
    client = await aiohttp_client(create_app(settings))
    runtime = client.app[RUNTIME]
    before = live_tasks()
    pc, body = await client_offer()
    response = await client.post("/offer", json=body | {"face_enhance": "sharpen"})
    assert response.status == 409  # a CPU-only server refuses sharpen without the flag
    assert "--face-enhance-allow-cpu" in (await response.json())["error"]
    await pc.close()
    await assert_nothing_left(client, before)

    runtime.sessions.enhance = dataclasses.replace(runtime.sessions.enhance, allow_cpu=True)
    pc, body = await client_offer()
    response = await client.post(
        "/offer", json=body | {"face_enhance": "sharpen", "face_enhance_strength": 0.4}
    )
    assert response.status == 200, await response.text()
    (session,) = runtime.sessions.sessions.values()
    assert session.stream.enhance_strength == 0.4
    assert runtime.backend.sharpener is not None  # type: ignore[attr-defined]
    await session.close("test over")
    await pc.close()


def test_serve_stops_on_unusable_restorer_files(tmp_path, files) -> None:
    checkpoint, restorer = files
    base = {"backend": "wav2lip", "checkpoint": checkpoint, "device": "cpu"}
    missing = tmp_path / "realesr-general-x4v3.pth"
    problem = face_enhance_problem(Settings(**base, face_enhance_weights=missing))
    assert problem is not None and str(missing) in problem
    assert "missing" in problem or "spandrel" in problem
    if spandrel_missing() is None:
        corrupt = tmp_path / "corrupt.pth"
        corrupt.write_bytes(b"PK\x03\x04 truncated")
        problem = face_enhance_problem(Settings(**base, face_enhance_weights=corrupt))
        assert problem is not None and str(corrupt) in problem and "corrupt" in problem
        problem = face_enhance_problem(Settings(**base, face_enhance_weights=checkpoint))
        assert problem is not None and "unsupported kind" in problem
        sharpen = Settings(**base, face_enhance="sharpen", face_enhance_weights=restorer)
        assert "--face-enhance-allow-cpu" in (face_enhance_problem(sharpen) or "")
        allowed = dataclasses.replace(sharpen, face_enhance_allow_cpu=True)
        assert face_enhance_problem(allowed) is None


def test_settings_refuse_sharpen_without_weights_and_bad_values() -> None:
    with pytest.raises(ValueError, match="--face-enhance-weights"):
        Settings(face_enhance="sharpen")
    with pytest.raises(ValueError, match="face_enhance must be one of off, sharpen"):
        Settings(face_enhance="blur")
    with pytest.raises(ValueError, match=r"face_enhance_strength must be in \[0, 1\]"):
        Settings(face_enhance_strength=1.5)
    with pytest.raises(ValueError, match="wav2lip only"):
        Settings(face_enhance_weights=Path("x.pth"))
    assert Settings().face_enhance == "off"
