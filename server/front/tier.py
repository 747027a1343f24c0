"""Runs in the **front**: forwards what is addressed to a session to its media worker; health and metrics.

:func:`install_media_tier` (called by ``create_app`` when ``media_workers > 1``) adds

* the worker pool (:mod:`lipcast.server.front.pool`), started once the front's runtime (avatars, engine)
  is up;
* a middleware: ``POST /offer`` and ``POST /whip`` are authenticated, admitted against the whole server's
  capacity, placed on the least-loaded worker and forwarded; ``/sessions/{id}``, ``/whip/{id}``,
  ``/whep/{id}`` and its viewers go to the worker that owns the session (404 for one no worker owns). The
  worker's answer comes back as it is, with ``X-Lipcast-Worker``. Everything else (static pages, avatars,
  config, CORS preflights) is served by the front's ordinary handlers;
* the front's ``/healthz`` (process CPU and frames summed over the front and every worker), ``/readyz``
  (capacity over all workers) and ``/metrics`` (every process's metrics, labelled, plus the pool's).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from lipcast.server import routes
from lipcast.server.auth import require_bearer
from lipcast.server.capacity import STARTING_RETRY_AFTER_S
from lipcast.server.errors import CapacityError, ServiceUnavailableError
from lipcast.server.front.pool import Worker, WorkerPool
from lipcast.server.front.promtext import merge_expositions
from lipcast.server.metrics import CONTENT_TYPE
from lipcast.server.serve import ALSO_DRAIN
from lipcast.server.state import METRICS, RUNTIME, SETTINGS, runtime_of

logger = logging.getLogger(__name__)

POOL = web.AppKey("media_worker_pool", WorkerPool)
FORWARD_TIMEOUT_S = 60.0  # an offer waits for the worker's ICE gathering
CREATE = ("/offer", "/whip")
SESSION_PATHS = (
    "/sessions/{session_id}",
    "/whip/{session_id}",
    "/whep/{session_id}",
    "/whep/{session_id}/viewers/{viewer_id}",
)
ENDS_SESSION = ("/sessions/{session_id}", "/whip/{session_id}")
# Not copied between the client and the worker: hop-by-hop, recomputed, or added by the front (CORS).
REQUEST_DROP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
RESPONSE_DROP = REQUEST_DROP | {"date", "server", "content-encoding", "vary"}
WORKER_HEADER = "X-Lipcast-Worker"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def install_media_tier(app: web.Application) -> None:
    app.middlewares.append(forward_middleware)
    app.cleanup_ctx.append(_pool_ctx)


async def _pool_ctx(app: web.Application) -> AsyncIterator[None]:
    runtime = app[RUNTIME]  # set by the runtime context, which runs first
    settings = app[SETTINGS]
    pool = WorkerPool(settings, runtime, settings.media_workers)
    app[POOL] = pool
    app[ALSO_DRAIN] = pool
    try:
        await pool.start()
    except BaseException:
        await pool.stop()
        raise
    try:
        yield
    finally:
        await pool.stop()


def _canonical(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    return None if resource is None else resource.canonical


@web.middleware
async def forward_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = _canonical(request)
    if request.method == "OPTIONS" or path is None:
        return await handler(request)
    if request.method == "GET" and path in FRONT_HANDLERS:
        return await FRONT_HANDLERS[path](request)
    pool = request.app.get(POOL)
    if pool is None:
        return await handler(request)
    if path in CREATE and request.method == "POST":
        return await _create(request, pool)
    if path in SESSION_PATHS:
        session_id = request.match_info["session_id"]
        runtime = request.app.get(RUNTIME)
        if runtime is not None and session_id in runtime.sessions.sessions:
            return await handler(request)  # a push session: it lives in the front (server/push.py)
        worker = pool.owner(session_id)
        response = await _forward(request, worker)
        if request.method == "DELETE" and path in ENDS_SESSION and response.status < 300:
            pool.forget(request.match_info["session_id"])
        return response
    return await handler(request)


async def _create(request: web.Request, pool: WorkerPool) -> web.Response:
    require_bearer(request)
    runtime_of(request)  # 503 while starting
    worker = pool.reserve()
    session_id: str | None = None
    try:
        response = await _forward(request, worker)
        if response.status < 300:
            session_id = _created_session(response)
    finally:
        pool.release(worker, session_id)
    return response


def _created_session(response: web.Response) -> str | None:
    location = response.headers.get("Location")
    if location:  # WHIP: /whip/{session_id}
        return location.rstrip("/").rsplit("/", 1)[-1]
    try:
        body = json.loads(response.body or b"{}")  # type: ignore[arg-type]
    except ValueError:
        return None
    session_id = body.get("session_id") if isinstance(body, dict) else None
    return session_id if isinstance(session_id, str) else None


async def _forward(request: web.Request, worker: Worker) -> web.Response:
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in REQUEST_DROP}
    timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)
    try:
        async with worker.http.request(
            request.method, f"http://worker{request.path_qs}", data=body, headers=headers, timeout=timeout
        ) as answer:
            payload = await answer.read()
            out: CIMultiDict[str] = CIMultiDict()
            for key, value in answer.headers.items():
                low = key.lower()
                if low not in RESPONSE_DROP and not low.startswith("access-control-"):
                    out.add(key, value)
    except (TimeoutError, aiohttp.ClientError) as e:
        logger.warning("%s did not answer %s %s: %s", worker.name, request.method, request.path, e)
        raise CapacityError(f"media worker {worker.index} did not answer; try again", 5) from e
    out[WORKER_HEADER] = str(worker.index)
    return web.Response(status=answer.status, body=payload, headers=out)


# ---- the front's own health and metrics ----


async def _states(pool: WorkerPool) -> list[tuple[Worker, dict[str, Any] | None]]:
    live = pool.live()
    states = await asyncio.gather(*(pool.fetch_state(w) for w in live))
    return list(zip(live, states, strict=True))


async def healthz(request: web.Request) -> web.Response:
    base = await routes.healthz(request)
    body = json.loads(base.body)  # type: ignore[arg-type]
    pool = request.app.get(POOL)
    if pool is None:
        return web.json_response(body)
    states = await _states(pool)
    cpu_s = time.process_time() + pool.retired["process_cpu_s"]
    frames = int(pool.retired["frames_sent_total"])
    workers = []
    for worker, state in states:
        state = state or worker.state  # an unanswered check: its last figures
        cpu_s += float(state.get("process_cpu_s", 0.0))
        frames += int(state.get("frames_sent_total", 0))
        workers.append(
            {
                "index": worker.index,
                "pid": worker.process.pid,
                "ready": bool(state.get("ready")),
                "sessions": len(worker.sessions),
                "process_cpu_s": state.get("process_cpu_s"),
                "cpu": state.get("cpu"),  # its own snapshot (per thread too), taken when it answered
                "frames_sent_total": state.get("frames_sent_total"),
                "link": state.get("link"),  # its frames on the engine link: done, expired, ring full
                "engine": worker.engine_index,  # which of the front's engines (GPUs) renders its calls
            }
        )
    devices = body.get("engine", {}).get("devices")
    if devices:  # one engine per GPU: the calls on each come from the workers bound to it
        for index, device in enumerate(devices):
            device["sessions"] = pool.engine_load(index)
    body |= {
        "sessions": pool.sessions_total,
        "frames_sent_total": frames,
        "process_cpu_s": round(cpu_s, 3),  # the front (and its engine) plus every worker, ended ones too
        "front_process_cpu_s": round(time.process_time(), 3),
        "media_workers": {
            "count": pool.count,
            "render_in": pool.render_in,
            "restarts": dict(pool.restarts),
            "sessions_lost": pool.sessions_lost,
            "workers": workers,
        },
    }
    return web.json_response(body)


def readiness(request: web.Request) -> tuple[bool, str]:
    runtime = request.app.get(RUNTIME)
    if runtime is None:
        return False, "starting"
    ready, reason = runtime.readiness()
    pool = request.app.get(POOL)
    if not ready or pool is None:
        return ready, reason
    if pool.draining:
        return False, "draining"
    if not any(w.ready for w in pool.live()):
        return False, "no media worker ready"
    if pool.sessions_total >= runtime.settings.max_sessions:
        return False, "no session capacity left"
    return True, "ready"


async def readyz(request: web.Request) -> web.Response:
    ready, reason = readiness(request)
    body: dict[str, Any] = {"ready": ready, "reason": reason}
    pool = request.app.get(POOL)
    runtime = request.app.get(RUNTIME)
    if runtime is not None:
        body["max_sessions"] = runtime.settings.max_sessions
        body["sessions"] = pool.sessions_total if pool is not None else len(runtime.sessions.sessions)
    if pool is not None:
        body["media_workers_ready"] = sum(1 for w in pool.live() if w.ready)
    if not ready:
        raise ServiceUnavailableError(reason, STARTING_RETRY_AFTER_S, details=body)
    return web.json_response(body)


async def metrics(request: web.Request) -> web.Response:
    texts = [("front", request.app[METRICS].render().decode("utf-8"))]
    pool = request.app.get(POOL)
    if pool is not None:
        live = pool.live()
        fetched = await asyncio.gather(*(_worker_metrics(w) for w in live))
        texts.extend((w.name, text) for w, text in zip(live, fetched, strict=True) if text)
        texts.append(("front", _pool_text(pool)))
    return web.Response(body=merge_expositions(texts).encode("utf-8"), headers={"Content-Type": CONTENT_TYPE})


async def _worker_metrics(worker: Worker) -> str | None:
    try:
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with worker.http.get("http://worker/metrics", timeout=timeout) as response:
            return await response.text() if response.status == 200 else None
    except (TimeoutError, aiohttp.ClientError):
        return None


def _pool_text(pool: WorkerPool) -> str:
    lines = [
        "# HELP lipcast_media_workers Media worker processes configured",
        "# TYPE lipcast_media_workers gauge",
        f"lipcast_media_workers {pool.count}",
        "# HELP lipcast_media_workers_ready Media workers taking calls now",
        "# TYPE lipcast_media_workers_ready gauge",
        f"lipcast_media_workers_ready {sum(1 for w in pool.live() if w.ready)}",
        "# HELP lipcast_media_worker_restarts Media workers replaced, by reason (crashed, hung)",
        "# TYPE lipcast_media_worker_restarts counter",
    ]
    for reason in ("crashed", "hung"):
        lines.append(f'lipcast_media_worker_restarts_total{{reason="{reason}"}} {pool.restarts[reason]}')
    lines += [
        "# HELP lipcast_media_worker_sessions_lost Calls lost with a media worker that failed",
        "# TYPE lipcast_media_worker_sessions_lost counter",
        f"lipcast_media_worker_sessions_lost_total {pool.sessions_lost}",
        "# HELP lipcast_front_sessions_refused Offers the front refused, by reason",
        "# TYPE lipcast_front_sessions_refused counter",
    ]
    for reason, count in sorted(pool.refused.items()):
        lines.append(f'lipcast_front_sessions_refused_total{{reason="{reason}"}} {count}')
    return "\n".join(lines) + "\n"


FRONT_HANDLERS: dict[str, Handler] = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}
