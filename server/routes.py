"""Thin HTTP handlers: parse, call the session manager, format. Errors are raised, never formatted here."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import cv2
from aiohttp import web
from aiortc import RTCSessionDescription

from lipcast.pipeline.engine_group import EngineGroup
from lipcast.pipeline.enhance.options import MODE_FIELD, STRENGTH_FIELD
from lipcast.server import cors, push, whip_whep
from lipcast.server.auth import require_bearer
from lipcast.server.capacity import STARTING_RETRY_AFTER_S
from lipcast.server.errors import BadRequestError, NotFoundError, ServiceUnavailableError
from lipcast.server.json_body import read_json_object
from lipcast.server.metrics import CONTENT_TYPE
from lipcast.server.offer_checks import requested_output_size
from lipcast.server.state import METRICS, RUNTIME, SETTINGS, Runtime, runtime_of
from lipcast.streaming.cpu_usage import cpu_snapshot
from lipcast.streaming.wire import OfferAnswer, avatar_json


def parse_offer(body: dict[str, Any]) -> tuple[RTCSessionDescription, str | None]:
    """The JSON shape of ``POST /offer``; the SDP itself is checked by :mod:`lipcast.server.offer_checks`,
    ``face_enhance`` and ``face_enhance_strength`` by the session manager (``enhance_choice``)."""
    sdp, kind, avatar = body.get("sdp"), body.get("type"), body.get("avatar")
    if not isinstance(sdp, str) or not sdp.strip():
        raise BadRequestError("'sdp' must be a non-empty string")
    if kind != "offer":
        raise BadRequestError("'type' must be \"offer\"")
    if avatar is not None and not isinstance(avatar, str):
        raise BadRequestError("'avatar' must be a string")
    return RTCSessionDescription(sdp=sdp, type="offer"), avatar


async def offer(request: web.Request) -> web.Response:
    require_bearer(request)
    runtime = runtime_of(request)
    body_in = await read_json_object(request)
    description, avatar_name = parse_offer(body_in)
    size = requested_output_size(body_in, runtime.settings.output_cap())
    enhance = runtime.sessions.enhance_choice(body_in.get(MODE_FIELD), body_in.get(STRENGTH_FIELD))
    answer = await runtime.sessions.create(description, avatar_name, enhance=enhance, size=size)
    session = runtime.sessions.get(answer.session_id)
    body: OfferAnswer = {
        "sdp": answer.sdp,
        "type": answer.type,
        "session_id": answer.session_id,
        "avatar": avatar_json(answer.avatar),
        "size": str(session.size),
        "codec": session.codec,
    }
    return web.json_response(body)


async def delete_session(request: web.Request) -> web.Response:
    require_bearer(request)
    runtime = runtime_of(request)
    session = runtime.sessions.get(request.match_info["session_id"])
    await session.close("deleted by client")
    return web.Response(status=204)


async def session_stats(request: web.Request) -> web.Response:
    require_bearer(request)
    runtime = runtime_of(request)
    session = runtime.sessions.get(request.match_info["session_id"])
    stream, buffer = session.stream, session.buffer
    return web.json_response(
        {
            "session_id": session.id,
            "avatar": session.avatar.name,
            "signalling": session.signalling,
            "size": str(session.size),
            "codec": session.codec,
            "connection": session.pc.connectionState,
            "viewers": session.viewers.stats_json(),
            "stream": vars(stream.stats),
            "video": vars(session.video.stats),
            "audio_sent_ticks": session.audio.sent,
            "buffer": {
                **vars(buffer.stats),
                "depth_ms": buffer.depth_ms,
                "target_ms": buffer.target_ms,
                "adaptive": buffer.jitter is not None,
                "jitter_p95_ms": buffer.jitter.percentile_ms if buffer.jitter is not None else None,
            },
            "delay_ms": {
                "jitter_buffer": buffer.target_ms,
                "lookahead": stream.delay_ms,
                "render_budget": runtime.settings.render_budget_ms,
            },
        }
    )


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers (200 during warm-up too: a slow start is not a dead process)."""
    runtime = request.app.get(RUNTIME)
    if runtime is None:
        return web.json_response({"status": "starting", "ready": False})
    return web.json_response(
        {
            "status": "ok",
            "ready": runtime.ready,
            "draining": runtime.draining,
            "backend": runtime.backend.name,
            "sessions": len(runtime.sessions.sessions),
            "frames_sent_total": runtime.sessions.frames_sent_total,
            "process_cpu_s": round(time.process_time(), 3),
            "cpu": cpu_snapshot(),
            "max_sessions": runtime.settings.max_sessions,
            "face_enhance": runtime.sessions.enhance.to_json(),
            "engine": {
                "running": runtime.engine.running,
                "warmup_s": runtime.engine.warmup_s,
                "batch_sizes": list(runtime.engine.batch_sizes),
                "stats": asdict(runtime.engine.stats),  # counters: batches, frames, busy_s, expired
                **engine_devices(runtime),
            },
            **runtime.device,
        }
    )


def engine_devices(runtime: Runtime) -> dict[str, Any]:
    """With one engine per GPU: each one's device, queue and counters (``{}`` with one engine)."""
    if isinstance(runtime.engine, EngineGroup):
        return {"devices": runtime.engine.per_device()}
    return {}


async def readyz(request: web.Request) -> web.Response:
    """Readiness: 200 when a new call would be taken now (warmed up, capacity left, not draining)."""
    runtime = request.app.get(RUNTIME)
    ready, reason = (False, "starting") if runtime is None else runtime.readiness()
    body = {"ready": ready, "reason": reason}
    if runtime is not None:
        body |= {"sessions": len(runtime.sessions.sessions), "max_sessions": runtime.settings.max_sessions}
    if not ready:
        raise ServiceUnavailableError(reason, STARTING_RETRY_AFTER_S, details=body)
    return web.json_response(body)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].render(), headers={"Content-Type": CONTENT_TYPE})


async def client_config(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    return web.json_response(
        {
            "ice_servers": [s.to_json() for s in settings.ice_servers],
            "max_output_size": str(settings.output_cap()),
            "video_codecs": list(settings.codec_preference()),
        }
    )


async def list_avatars(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    return web.json_response(
        {
            "avatars": [avatar_json(a) for _, a in sorted(runtime.avatars.items())],
            "default": runtime.settings.avatar,
        }
    )


async def avatar_preview(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    name = request.match_info["name"]
    avatar = runtime.avatars.get(name)
    if avatar is None:
        raise NotFoundError(f"unknown avatar {name!r}")
    ok, png = cv2.imencode(".png", cv2.cvtColor(avatar.frames[0], cv2.COLOR_RGB2BGR))
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return web.Response(body=png.tobytes(), content_type="image/png")


def setup(app: web.Application) -> None:
    static_dir = app[SETTINGS].static_dir

    async def index(request: web.Request) -> web.FileResponse:
        return web.FileResponse(static_dir / "index.html")

    app.router.add_get("/", index)
    app.router.add_post("/offer", offer)
    app.router.add_delete("/sessions/{session_id}", delete_session)
    app.router.add_get("/sessions/{session_id}", session_stats)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/config", client_config)
    app.router.add_get("/avatars", list_avatars)
    app.router.add_get("/avatars/{name}/preview.png", avatar_preview)
    whip_whep.setup(app)
    push.setup(app)
    cors.setup(
        app,
        ("/offer", "/sessions", "/sessions/{session_id}", "/avatars", "/avatars/jobs/{job_id}", "/config"),
    )
    if static_dir.is_dir():
        app.router.add_static("/static/", static_dir)
