"""Runs in a **media worker**: builds the worker's :class:`~lipcast.server.state.Runtime` and its state
endpoint."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

from lipcast.pipeline.backend import LipSyncBackend
from lipcast.pipeline.devices import configure_threads
from lipcast.pipeline.engine_link.client import SharedRenderer
from lipcast.server.assembly import build_linked_runtime, build_runtime
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME, Runtime
from lipcast.server.worker.messages import ENGINE, LinkedBackend, WorkerSpec, WorkerState
from lipcast.streaming.clock import Clock
from lipcast.streaming.cpu_usage import cpu_snapshot


def runtime_builder(
    spec: WorkerSpec, on_engine_lost: Callable[[], None]
) -> Callable[[Settings, Clock | None], Runtime]:
    """How this worker builds its runtime: linked to the front's engine, or with a CPU engine of its own."""

    def linked(settings: Settings, clock: Clock | None) -> Runtime:
        link, info = spec.link, spec.backend
        if link is None or info is None:
            raise RuntimeError("a worker rendering in the engine needs its link and backend description")
        configure_threads(info.name, _cpu(), 1)
        renderer = SharedRenderer(link.layout, link.shm_name, link.conn, on_lost=on_engine_lost)
        backend = cast(LipSyncBackend, LinkedBackend(info))
        device = {"device": "front process (shared engine)", "render_in": ENGINE}
        return build_linked_runtime(settings, renderer, backend, device, clock)

    def local(settings: Settings, clock: Clock | None) -> Runtime:
        runtime = build_runtime(settings.with_overrides(device="cpu", gpus=()), clock)
        runtime.device["render_in"] = "worker"
        return runtime

    return linked if spec.render_in == ENGINE else local


def _cpu() -> Any:
    import torch

    return torch.device("cpu")


async def worker_state(request: web.Request) -> web.Response:
    """What the front polls: live session ids, counters, CPU time. Answering at all proves liveness."""
    runtime = request.app.get(RUNTIME)
    spec: WorkerSpec = request.app[WORKER_SPEC]
    body: WorkerState = {
        "index": spec.index,
        "pid": os.getpid(),
        "process_cpu_s": round(time.process_time(), 3),
        "cpu": cpu_snapshot(),
        "ready": False,
    }
    if runtime is not None:
        sessions = runtime.sessions
        totals = sessions.totals()
        body |= {
            "ready": runtime.ready and not runtime.draining and runtime.engine.running,
            "draining": runtime.draining,
            "sessions": sorted(sessions.sessions),
            "frames_sent_total": totals["frames_out"],
            "created_total": sessions.created_total,
        }
        renderer = runtime.engine
        if isinstance(renderer, SharedRenderer):
            body["link"] = vars(renderer.link_stats)
    return web.json_response(body)


WORKER_SPEC = web.AppKey("worker_spec", WorkerSpec)
