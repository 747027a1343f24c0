"""Avatar uploads over HTTP: a job prepares the avatar, two calls use two avatars; every bad input is a 4xx.

Inputs are generated: a drawn face video (PyAV), a still, blank and noise files.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from lipcast.pipeline.assembly import load_avatars
from lipcast.probe.client import call
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.flags import parse_settings
from lipcast.server.state import RUNTIME
from tests.fakes import speech_pattern, to_int16
from tests.pipeline.face_media import drawn_face, drawn_face_frames, encode_video, write_image


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("upload-media")
    blank = [np.full((96, 128, 3), 80, np.uint8)] * 40
    return {
        "drawn": encode_video(root / "drawn.mp4", drawn_face_frames(20)),
        "still": write_image(root / "still.jpg", drawn_face()),
        "blank": encode_video(root / "blank.mp4", blank),
        # A face for the first second, then none: the quick check passes, the job fails.
        "vanishing": encode_video(root / "vanishing.mp4", drawn_face_frames(25) + blank_like(50)),
        "long": encode_video(root / "long.mp4", drawn_face_frames(100)),  # 4 s
        "large": encode_video(root / "large.mp4", drawn_face_frames(5, width=480, height=360)),
    }


def blank_like(count: int) -> list[np.ndarray]:
    return [np.full((160, 160, 3), 70, np.uint8)] * count


@pytest.fixture
def upload_dir(tmp_path: Path) -> Path:
    return tmp_path / "uploads"


@pytest.fixture
async def client(aiohttp_client: Any, upload_dir: Path) -> Any:
    settings = Settings(
        upload_dir=upload_dir,
        max_upload_mb=0.25,
        max_upload_duration_s=3.0,
        max_upload_side_px=400,
        connect_timeout_s=10,
    )
    return await aiohttp_client(create_app(settings))


def form(name: str | None, path: Path | None = None, data: bytes | None = None) -> aiohttp.FormData:
    body = aiohttp.FormData(default_to_multipart=True)
    if name is not None:
        body.add_field("name", name)
    if path is not None or data is not None:
        content = data if data is not None else path.read_bytes()  # type: ignore[union-attr]
        filename = path.name if path is not None else "upload.bin"
        body.add_field("file", content, filename=filename, content_type="application/octet-stream")
    return body


async def finished(client: Any, job: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll the job until it is done or failed (it runs on a worker thread: real time passes)."""
    for _ in range(int(timeout_s / 0.05)):
        async with client.get(job["url"]) as response:
            assert response.status == 200
            job = await response.json()
        if job["state"] in ("done", "failed"):
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job still {job['state']} after {timeout_s} s")


def nothing_left(upload_dir: Path) -> bool:
    """No avatar, no work directory, no staged upload."""
    entries = [p.name for p in upload_dir.iterdir() if p.name != ".uploads"] if upload_dir.exists() else []
    staged = list((upload_dir / ".uploads").iterdir()) if (upload_dir / ".uploads").exists() else []
    return entries == [] and staged == []


@pytest.mark.usefixtures("loopback_ice")
@pytest.mark.slow
async def test_upload_then_two_calls_with_two_avatars(
    client: Any, media: dict[str, Path], upload_dir: Path
) -> None:
    async with client.post("/avatars", data=form("drawn", media["drawn"])) as response:
        assert response.status == 202, await response.text()
        job = await response.json()
        assert response.headers["Location"] == job["url"] == f"/avatars/jobs/{job['id']}"
    assert job["name"] == "drawn" and job["state"] in ("queued", "running", "done")
    job = await finished(client, job)
    assert job["state"] == "done" and job["progress"] == 1.0 and job["frames_done"] == 20, job
    assert job["avatar"]["name"] == "drawn" and job["avatar"]["frames"] == 20
    assert (upload_dir / "drawn" / "manifest.json").is_file()

    async with client.post("/avatars", data=form("still", media["still"])) as response:
        job = await finished(client, await response.json())
    assert job["state"] == "done" and job["avatar"]["idle"] == "breathing" and job["avatar"]["frames"] == 1

    async with client.get("/avatars") as response:
        listing = await response.json()
    names = {a["name"]: a for a in listing["avatars"]}
    assert set(names) == {"astronaut", "drawn", "still"} and listing["default"] == "astronaut"
    assert (names["drawn"]["width"], names["drawn"]["height"]) == (160, 160)
    async with client.get(names["drawn"]["preview_url"]) as response:
        assert response.status == 200 and response.content_type == "image/png"

    # Two concurrent calls, each with its own avatar.
    audio = to_int16(speech_pattern([("silence", 0.3), ("speech", 0.8), ("silence", 0.4)]))
    base_url = str(client.make_url("")).rstrip("/")
    first, second = await asyncio.gather(
        call(base_url, audio, avatar="astronaut", tail_s=0.5, http=client.session),
        call(base_url, audio, avatar="drawn", tail_s=0.5, http=client.session),
    )
    assert first.avatar["name"] == "astronaut" and second.avatar["name"] == "drawn"
    assert first.video.size == (320, 320) and second.video.size == (160, 160)
    assert len(first.video.pts) > 20 and len(second.video.pts) > 20
    engine = client.app[RUNTIME].engine
    assert engine.stats.frames > 0 and engine.stats.failed_batches == 0

    # The name is taken now; a server started on the same directory finds both uploads again.
    async with client.post("/avatars", data=form("drawn", media["drawn"])) as response:
        assert response.status == 409
    assert set(load_avatars(client.app[RUNTIME].settings.avatar_search_path(), "astronaut")) == {
        "astronaut",
        "drawn",
        "still",
    }


@pytest.mark.parametrize(
    ("case", "status", "message"),
    [
        ("no name", 400, "needs a 'name'"),
        ("no file", 400, "needs a 'file'"),
        ("traversal", 400, "invalid avatar name"),
        ("upper case", 400, "invalid avatar name"),
        ("text file", 415, "not a video or an image"),
        ("empty file", 400, "empty"),
        ("no face", 422, "no face found"),
        ("too large", 413, "larger than 0.25 MB"),
        ("too long", 422, "at most 3 s"),
        ("too many pixels", 422, "at most 400 pixels"),
        ("taken", 409, "exists already"),
    ],
)
async def test_bad_uploads_get_a_clear_4xx_and_leave_nothing(
    client: Any, media: dict[str, Path], upload_dir: Path, case: str, status: int, message: str
) -> None:
    body = {
        "no name": form(None, media["drawn"]),
        "no file": form("x"),
        "traversal": form("../escape", media["drawn"]),
        "upper case": form("Drawn", media["drawn"]),
        "text file": form("text", data=b"hello, this is not a video\n" * 50),
        "empty file": form("empty", data=b""),
        "no face": form("blank", media["blank"]),
        "too large": form("large", data=np.random.default_rng(0).bytes(300_000)),
        "too long": form("long", media["long"]),
        "too many pixels": form("big", media["large"]),
        "taken": form("astronaut", media["drawn"]),
    }[case]
    async with client.post("/avatars", data=body) as response:
        assert response.status == status, await response.text()
        error = (await response.json())["error"]
    assert message in error, error
    assert nothing_left(upload_dir)
    async with client.get("/avatars") as response:
        assert [a["name"] for a in (await response.json())["avatars"]] == ["astronaut"]


async def test_a_job_that_fails_later_reports_it_and_leaves_nothing(
    client: Any, media: dict[str, Path], upload_dir: Path
) -> None:
    async with client.post("/avatars", data=form("vanishing", media["vanishing"])) as response:
        assert response.status == 202
        job = await finished(client, await response.json())
    assert job["state"] == "failed" and job["status"] == 422 and "only 25 of 75 frames" in job["error"]
    assert job["avatar"] is None
    assert nothing_left(upload_dir)


async def test_other_requests(client: Any) -> None:
    async with client.post("/avatars", json={"name": "x"}) as response:
        assert response.status == 415
    async with client.get("/avatars/jobs/nope") as response:
        assert response.status == 404 and "no avatar job" in (await response.json())["error"]


async def test_uploads_are_off_without_an_upload_dir(aiohttp_client: Any, media: dict[str, Path]) -> None:
    client = await aiohttp_client(create_app(Settings()))
    async with client.post("/avatars", data=form("drawn", media["drawn"])) as response:
        assert response.status == 403 and "--upload-dir" in (await response.json())["error"]


async def test_a_server_with_a_token_takes_uploads_only_with_it(
    aiohttp_client: Any, media: dict[str, Path], tmp_path: Path
) -> None:
    client = await aiohttp_client(create_app(Settings(upload_dir=tmp_path, auth_token="secret")))
    async with client.post("/avatars", data=form("drawn", media["drawn"])) as response:
        assert response.status == 401
    headers = {"Authorization": "Bearer secret"}
    async with client.post("/avatars", data=form("drawn", media["drawn"]), headers=headers) as response:
        assert response.status == 202
        job = await response.json()
    async with client.get(job["url"]) as response:
        assert response.status == 401
    async with client.get(job["url"], headers=headers) as response:
        assert response.status == 200


def test_upload_settings_from_flags_and_environment() -> None:
    assert parse_settings([], env={}).upload_dir is None
    assert parse_settings(["--avatar-dir", "/a", "--avatar-dir", "/b"], env={}).upload_dir == Path("/a")
    settings = parse_settings(
        ["--avatar-dir", "/a", "--upload-dir", "/u", "--max-upload-mb", "5"],
        env={"LIPCAST_MAX_UPLOAD_DURATION_S": "12", "LIPCAST_AVATAR_MAX_SIDE_PX": "480"},
    )
    assert settings.upload_dir == Path("/u") and settings.max_upload_mb == 5.0
    assert settings.max_upload_duration_s == 12.0 and settings.avatar_max_side_px == 480
    with pytest.raises(ValueError, match="max_upload_mb"):
        Settings(max_upload_mb=0)
