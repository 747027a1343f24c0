"""Avatar uploads: ``POST /avatars`` starts a preparation job, ``GET /avatars/jobs/{id}`` tells its progress.

An upload is ``multipart/form-data`` with a ``name`` field and a ``file`` (a video or an image of a face). The
handler streams the file to the upload directory (refusing it past ``max_upload_mb``), then checks, off the
event loop, that it is a video or image within the limits and that a face shows in its first second; any
of that failing is a 4xx and nothing stays behind. Then it answers ``202`` with the job, which prepares the
avatar on one worker thread (so a preparation never takes more than one core from live calls), renames it
into the upload directory when complete and offers it through the registry: a call can pick it at once.

Job JSON: ``{"id", "name", "state": "queued" | "running" | "done" | "failed", "progress": 0..1 | null,
"frames_done", "frames_total", "error": str | null, "status": HTTP status of the failure | null,
"avatar": the avatar as GET /avatars lists it | null, "url"}``. With ``--auth-token`` both routes need the
bearer token.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import BodyPartReader, web

from lipcast.pipeline.avatar import AvatarError, validate_name
from lipcast.pipeline.avatar_prepare import (
    AvatarExistsError,
    InputLimitError,
    NoFaceError,
    NotMediaError,
    PrepareOptions,
    check_limits,
    first_face,
    prepare_avatar,
    probe_media,
)
from lipcast.pipeline.face_detect import create_detector
from lipcast.server.auth import require_bearer
from lipcast.server.config import Settings
from lipcast.server.errors import (
    ApiError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    PayloadTooLargeError,
    UnprocessableError,
    UnsupportedMediaTypeError,
)
from lipcast.server.state import RUNTIME, SETTINGS, Runtime, runtime_of
from lipcast.streaming.wire import AvatarJson, avatar_json

logger = logging.getLogger(__name__)


STAGING_DIR = ".uploads"  # inside the upload directory; hidden, so never taken for an avatar
CHUNK_BYTES = 256 * 1024
MAX_FIELD_BYTES = 1024  # the form's text fields
MULTIPART_OVERHEAD_BYTES = 64 * 1024  # boundaries and headers on top of the file
KEPT_JOBS = 100  # finished jobs remembered for GET /avatars/jobs/{id}
SUFFIX_PATTERN = re.compile(r"^\.[a-z0-9]{1,5}$")


def status_of(error: AvatarError) -> int:
    """The HTTP status of a preparation failure."""
    if isinstance(error, NotMediaError):
        return 415
    if isinstance(error, InputLimitError | NoFaceError):
        return 422
    if isinstance(error, AvatarExistsError):
        return 409
    return 400


def as_api_error(error: AvatarError) -> ApiError:
    kinds: dict[int, type[ApiError]] = {
        409: ConflictError,
        415: UnsupportedMediaTypeError,
        422: UnprocessableError,
    }
    return kinds.get(status_of(error), BadRequestError)(str(error))


class JobCancelledError(Exception):
    """The server is shutting down."""


@dataclass
class AvatarJob:
    id: str
    name: str
    state: str = "queued"  # queued | running | done | failed
    frames_done: int = 0
    frames_total: int | None = None
    error: str | None = None
    status: int | None = None
    avatar: AvatarJson | None = None
    created_s: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        progress = None
        if self.state == "done":
            progress = 1.0
        elif self.frames_total:
            progress = round(min(1.0, self.frames_done / self.frames_total), 3)
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "progress": progress,
            "frames_done": self.frames_done,
            "frames_total": self.frames_total,
            "error": self.error,
            "status": self.status,
            "avatar": self.avatar,
            "url": f"/avatars/jobs/{self.id}",
        }


class AvatarJobs:
    """Preparation jobs on one worker thread; names are reserved from upload to the end of the job."""

    def __init__(self, runtime: Runtime, upload_dir: Path) -> None:
        self.runtime = runtime
        self.upload_dir = upload_dir
        self.jobs: OrderedDict[str, AvatarJob] = OrderedDict()
        self._reserved: set[str] = set()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="avatar-prepare")
        self._clean_leftovers()

    def _clean_leftovers(self) -> None:
        """Remove what a server that stopped mid-upload left: staged files and work directories."""
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        for work in self.upload_dir.glob(".*.prep-*"):
            shutil.rmtree(work, ignore_errors=True)

    @property
    def staging_dir(self) -> Path:
        return self.upload_dir / STAGING_DIR

    def options(self) -> PrepareOptions:
        settings = self.runtime.settings
        return PrepareOptions(
            fps=settings.fps,
            max_side_px=settings.avatar_max_side_px,
            max_duration_s=settings.max_upload_duration_s,
            truncate=False,
            max_input_side_px=settings.max_upload_side_px,
        )

    def reserve(self, name: str) -> None:
        with self._lock:
            if name in self.runtime.avatars or name in self._reserved or (self.upload_dir / name).exists():
                raise ConflictError(f"an avatar named {name!r} exists already or is being prepared")
            self._reserved.add(name)

    def release(self, name: str) -> None:
        with self._lock:
            self._reserved.discard(name)

    def get(self, job_id: str) -> AvatarJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFoundError(f"no avatar job {job_id!r}")
        return job

    def check(self, staged: Path) -> None:
        """The quick checks an upload gets before it is accepted (blocking: run it off the event loop)."""
        options = self.options()
        info = probe_media(staged)
        check_limits(info, options)
        first_face(staged, info, options, create_detector())

    def submit(self, name: str, staged: Path) -> AvatarJob:
        job = AvatarJob(secrets.token_urlsafe(9), name)
        with self._lock:
            self.jobs[job.id] = job
            while len(self.jobs) > KEPT_JOBS:
                oldest = next(iter(self.jobs.values()))
                if oldest.state not in ("done", "failed"):
                    break
                self.jobs.popitem(last=False)
        self._executor.submit(self._run, job, staged)
        return job

    def _run(self, job: AvatarJob, staged: Path) -> None:
        job.state = "running"
        destination = self.upload_dir / job.name
        prepared = False

        def progress(done: int, total: int | None) -> None:
            if self._closing.is_set():
                raise JobCancelledError("the server is shutting down")
            job.frames_done, job.frames_total = done, total

        try:
            avatar = prepare_avatar(staged, job.name, self.upload_dir, self.options(), progress=progress)
            prepared = True
            job.avatar = avatar_json(self.runtime.avatars.add(avatar))
            job.state = "done"
            logger.info("avatar job %s: %r ready", job.id, job.name)
        except AvatarError as e:
            self._fail(job, status_of(e), str(e))
        except JobCancelledError as e:
            self._fail(job, 503, str(e))
        except Exception:
            logger.exception("avatar job %s (%r) failed", job.id, job.name)
            self._fail(job, 500, "preparing the avatar failed on the server")
        finally:
            if prepared and job.state != "done":
                shutil.rmtree(destination, ignore_errors=True)
            staged.unlink(missing_ok=True)
            self.release(job.name)

    @staticmethod
    def _fail(job: AvatarJob, status: int, message: str) -> None:
        job.error, job.status, job.state = message, status, "failed"
        logger.info("avatar job %s (%r) failed: %s", job.id, job.name, message)

    def close(self) -> None:
        """Cancel queued jobs and stop a running one at its next frame."""
        self._closing.set()
        self._executor.shutdown(wait=False, cancel_futures=True)


JOBS = web.AppKey("avatar_jobs", AvatarJobs)


def jobs_of(request: web.Request) -> AvatarJobs:
    runtime_of(request)  # 503 while starting
    jobs = request.app.get(JOBS)
    if jobs is None:
        raise ForbiddenError(
            "avatar uploads are off: start the server with --upload-dir DIR (or an --avatar-dir DIR)"
        )
    return jobs


async def _read_field(part: BodyPartReader) -> str:
    data = bytearray()
    while chunk := await part.read_chunk(MAX_FIELD_BYTES):
        data.extend(chunk)
        if len(data) > MAX_FIELD_BYTES:
            raise BadRequestError(f"form field {part.name!r} is too long")
    return data.decode("utf-8", errors="replace").strip()


async def _stage(part: BodyPartReader, directory: Path, max_bytes: int) -> Path:
    """Stream an uploaded file to ``directory``; at most ``max_bytes`` (else 413, and nothing kept)."""
    suffix = Path(part.filename or "").suffix.lower()
    suffix = suffix if SUFFIX_PATTERN.match(suffix) else ""
    path = directory / f"{secrets.token_hex(8)}{suffix}"
    size = 0
    try:
        with path.open("wb") as out:
            while chunk := await part.read_chunk(CHUNK_BYTES):
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLargeError(f"the file is larger than {max_bytes / 2**20:g} MB")
                out.write(chunk)  # a quarter MB at a time: short enough for the event loop
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    if size == 0:
        path.unlink(missing_ok=True)
        raise BadRequestError("the uploaded file is empty")
    return path


async def upload_avatar(request: web.Request) -> web.Response:
    require_bearer(request)  # a server with a token takes uploads only from its holders
    jobs = jobs_of(request)
    settings: Settings = request.app[SETTINGS]
    max_bytes = int(settings.max_upload_mb * 2**20)
    if request.content_length is not None and request.content_length > max_bytes + MULTIPART_OVERHEAD_BYTES:
        raise PayloadTooLargeError(f"the upload is larger than {settings.max_upload_mb:g} MB")
    if not request.content_type.startswith("multipart/form-data"):
        raise UnsupportedMediaTypeError("send multipart/form-data with a 'name' field and a 'file'")
    name: str | None = None
    staged: Path | None = None
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise BadRequestError("nested multipart bodies are not accepted")
            if part.name == "name":
                name = await _read_field(part)
            elif part.name == "file" and staged is None:
                staged = await _stage(part, jobs.staging_dir, max_bytes)
            else:
                await part.release()
        if not name:
            raise BadRequestError("the form needs a 'name' field")
        if staged is None:
            raise BadRequestError("the form needs a 'file' (a video or an image)")
        try:
            validate_name(name)
        except AvatarError as e:
            raise BadRequestError(str(e)) from e
        jobs.reserve(name)
        try:
            await asyncio.get_running_loop().run_in_executor(None, jobs.check, staged)
        except BaseException as e:
            jobs.release(name)
            if isinstance(e, AvatarError):
                raise as_api_error(e) from e
            raise
    except BaseException:
        if staged is not None:
            staged.unlink(missing_ok=True)
        raise
    job = jobs.submit(name, staged)
    logger.info("avatar upload %r accepted as job %s", name, job.id)
    return web.json_response(job.to_json(), status=202, headers={"Location": f"/avatars/jobs/{job.id}"})


async def avatar_job(request: web.Request) -> web.Response:
    require_bearer(request)
    return web.json_response(jobs_of(request).get(request.match_info["job_id"]).to_json())


def setup(app: web.Application) -> None:
    """Register the upload routes; the jobs start with the runtime and stop before it."""

    async def jobs_ctx(app: web.Application) -> AsyncIterator[None]:
        upload_dir = app[SETTINGS].upload_dir
        jobs = None
        if upload_dir is not None:
            jobs = AvatarJobs(app[RUNTIME], upload_dir)
            app[JOBS] = jobs
        try:
            yield
        finally:
            if jobs is not None:
                jobs.close()

    app.cleanup_ctx.append(jobs_ctx)
    app.router.add_post("/avatars", upload_avatar)
    app.router.add_get("/avatars/jobs/{job_id}", avatar_job)
