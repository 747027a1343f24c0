"""Runs in the **front**: the media worker processes, where calls go, and what happens when a worker fails.

Each worker is a ``multiprocessing`` (spawn) process serving the lipcast API on a Unix socket in a private
directory; with the shared engine it also has an :class:`~lipcast.pipeline.engine_link.bridge.EngineBridge`
(its shared-memory ring and pipe). The pool

* places a new call on the ready worker with the fewest calls (reserving the slot while the offer is
  forwarded) and refuses it when the whole server has ``max_sessions`` calls (503, Retry-After); with one
  engine per GPU (:class:`~lipcast.pipeline.engine_group.EngineGroup`) worker ``i`` is bound to engine
  ``i % engines`` and a call first goes to the engine with the most headroom (the fewest calls), then to
  the least-loaded worker bound to it;
* remembers which worker owns which session, learnt from the answers, and forgets sessions that a worker no
  longer reports (its health check lists its live sessions);
* notices a worker that exits (its process sentinel, at once) or hangs (no health check answered for
  ``worker_hang_timeout_s``; it is killed): its calls are lost and their slots freed (sessions, engine
  frames), it is logged and counted in ``/metrics``, and a new worker takes its place; other workers' calls
  go on;
* drains on SIGTERM: no new calls, each worker drains its own, and the pool waits for them to exit.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

import aiohttp

from lipcast.pipeline.defaults import BUILTIN
from lipcast.pipeline.engine import RenderEngine
from lipcast.pipeline.engine_group import EngineGroup
from lipcast.pipeline.engine_link.bridge import EngineBridge
from lipcast.pipeline.engine_link.ring import RingLayout
from lipcast.server.capacity import RETRY_AFTER_S
from lipcast.server.config import Settings
from lipcast.server.errors import CapacityError, NotFoundError
from lipcast.server.state import Runtime
from lipcast.server.worker.main import run_worker
from lipcast.server.worker.messages import (
    ENGINE,
    STATE_PATH,
    WORKER,
    BackendInfo,
    EngineLinkSpec,
    WorkerSpec,
)

logger = logging.getLogger(__name__)

ENGINE_SLOTS_PER_WORKER = 48  # frames in flight per worker (a call has ~1-2 at a 40 ms render budget)
HEALTH_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 2.0
START_TIMEOUT_S = 180.0  # spawn, imports (torch), avatars, a local engine's warm-up, on a loaded machine
STOP_GRACE_S = 10.0


def resolve_render_in(settings: Settings, runtime: Runtime) -> str:
    """``auto``: the built-in backend on a CPU renders in each worker (no hop, and its renders are tiny);
    everything else goes to the one engine (the GPU, batched across all workers)."""
    if settings.render_in != "auto":
        return settings.render_in
    on_cpu = str(runtime.device.get("device", "cpu")).startswith("cpu")
    return WORKER if settings.backend == BUILTIN and on_cpu else ENGINE


def front_engines(runtime: Runtime) -> list[RenderEngine]:
    """The front's engines, one per device, that workers are bound to."""
    engine = runtime.engine
    if isinstance(engine, EngineGroup):
        return list(engine.engines)
    if isinstance(engine, RenderEngine):
        return [engine]
    raise RuntimeError("the front's engine must be a RenderEngine or an EngineGroup")


def engine_load(workers: list[Worker], engine_index: int) -> int:
    return sum(w.load for w in workers if w.engine_index == engine_index)


def place_call(ready: list[Worker], live: list[Worker]) -> Worker:
    """Where a new call goes: the engine (GPU) with the fewest calls over all its live workers, then its
    ready worker with the fewest calls (with one engine: simply the least-loaded worker)."""
    return min(ready, key=lambda w: (engine_load(live, w.engine_index), w.load, w.index))


@dataclass
class Worker:
    index: int
    generation: int
    process: BaseProcess
    socket_path: str
    http: aiohttp.ClientSession
    bridge: EngineBridge | None
    engine_index: int = 0  # which of the front's engines (GPUs) renders its calls
    started_s: float = field(default_factory=time.monotonic)
    sessions: dict[str, float] = field(default_factory=dict)  # session id -> when the front learnt it
    reserved: int = 0
    ready: bool = False
    lost: bool = False
    last_seen_s: float = field(default_factory=time.monotonic)
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def load(self) -> int:
        return len(self.sessions) + self.reserved

    @property
    def name(self) -> str:
        return f"worker-{self.index}"


class WorkerPool:
    def __init__(self, settings: Settings, runtime: Runtime, count: int) -> None:
        self.settings = settings
        self.runtime = runtime
        self.count = count
        self.render_in = resolve_render_in(settings, runtime)
        self.workers: list[Worker | None] = [None] * count
        self.draining = False
        self.stopping = False
        self.restarts: Counter[str] = Counter()  # by reason: crashed, hung
        self.sessions_lost = 0
        self.refused: Counter[str] = Counter()
        self.retired = {"process_cpu_s": 0.0, "frames_sent_total": 0}  # what workers that ended had done
        self._dir = tempfile.mkdtemp(prefix="lipcast-workers-")
        self._context = multiprocessing.get_context("spawn")
        self._generation = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._monitor: asyncio.Task[None] | None = None
        self._backend_info = BackendInfo.of(runtime.backend) if self.render_in == ENGINE else None
        self.engines = front_engines(runtime) if self.render_in == ENGINE else []
        avatars = list(runtime.avatars.values())
        self._layout = RingLayout(
            ENGINE_SLOTS_PER_WORKER,
            tuple(runtime.backend.conditioning_shape),
            max((a.width * a.height * 3 for a in avatars), default=3),
        )

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        for index in range(self.count):
            self._spawn(index)
        self._monitor = asyncio.create_task(self._watch(), name="media-worker-health")
        await self.wait_ready(START_TIMEOUT_S)
        logger.info(
            "%d media worker(s) ready (frames rendered in %s)",
            self.count,
            "the front's engine" if self.render_in == ENGINE else "each worker",
        )

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(w is not None and w.ready for w in self.workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"media workers not ready after {timeout_s:g} s")
            for w in self.workers:
                if w is not None and not w.process.is_alive() and not w.ready:
                    raise RuntimeError(f"{w.name} exited during startup (code {w.process.exitcode})")
            await asyncio.sleep(0.1)

    def _spawn(self, index: int) -> Worker:
        self._generation += 1
        socket_path = os.path.join(self._dir, f"w{index}-{self._generation}.sock")
        bridge: EngineBridge | None = None
        link: EngineLinkSpec | None = None
        worker_end = None
        engine_index = index % len(self.engines) if self.engines else 0
        if self.render_in == ENGINE:
            engine = self.engines[engine_index]
            engine_end, worker_end = self._context.Pipe()
            bridge = EngineBridge(engine, self._layout, engine_end, f"w{index}.{self._generation}")
            bridge.start()
            link = EngineLinkSpec(self._layout, bridge.shm_name, worker_end)
        spec = WorkerSpec(
            index=index,
            # The runtime's settings: what the front resolved at startup (batch sizes, measured budget).
            settings=self.runtime.settings.with_overrides(media_workers=1, virtualcam=False),
            socket_path=socket_path,
            parent_pid=os.getpid(),
            render_in=self.render_in,
            link=link,
            backend=self._backend_info,
        )
        process = self._context.Process(target=run_worker, args=(spec,), name=f"lipcast-worker-{index}")
        process.start()
        if worker_end is not None:
            worker_end.close()  # the child has its copy; ours would keep the pipe open after it dies
        http = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path))
        worker = Worker(index, self._generation, process, socket_path, http, bridge, engine_index)
        self.workers[index] = worker
        asyncio.get_running_loop().add_reader(process.sentinel, self._exited, worker)
        logger.info("%s started (pid %s)", worker.name, process.pid)
        return worker

    async def stop(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after a grace period) and free what they used."""
        self.stopping = True
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
        workers = [w for w in self.workers if w is not None]
        for w in workers:
            self._signal(w, signal.SIGTERM)
        await self._wait_exit(workers, STOP_GRACE_S)
        for w in workers:
            if w.process.is_alive():
                self._signal(w, signal.SIGKILL)
        await self._wait_exit(workers, STOP_GRACE_S)
        for w in workers:
            self._release(w)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    async def drain(self, timeout_s: float) -> int:
        """SIGTERM: no new calls; each worker drains its own; wait until they have all exited."""
        self.draining = True
        workers = [w for w in self.workers if w is not None and not w.lost]
        remaining = sum(len(w.sessions) for w in workers)
        for w in workers:
            self._signal(w, signal.SIGTERM)
        await self._wait_exit(workers, timeout_s + STOP_GRACE_S)
        return remaining

    async def close_all(self, reason: str) -> None:
        """A second signal: every worker closes its calls now."""
        logger.info("closing every call in the media workers (%s)", reason)
        for w in self.workers:
            if w is not None and w.process.is_alive():
                self._signal(w, signal.SIGTERM)

    @staticmethod
    def _signal(worker: Worker, signum: signal.Signals) -> None:
        if worker.process.pid is not None and worker.process.is_alive():
            try:
                os.kill(worker.process.pid, signum)
            except ProcessLookupError:
                pass

    @staticmethod
    async def _wait_exit(workers: list[Worker], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for w in workers:
            await asyncio.to_thread(w.process.join, max(0.0, deadline - time.monotonic()))

    def _release(self, worker: Worker) -> None:
        try:
            asyncio.get_running_loop().remove_reader(worker.process.sentinel)
        except (ValueError, OSError):
            pass
        if worker.bridge is not None:
            worker.bridge.close()
        task = asyncio.create_task(worker.http.close())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            os.unlink(worker.socket_path)
        except FileNotFoundError:
            pass
        worker.process.join(timeout=0)

    # -- faults ---------------------------------------------------------------------------------------------

    def _exited(self, worker: Worker) -> None:
        """The worker's process sentinel fired: it exited."""
        code = worker.process.exitcode
        if self.stopping or self.draining:
            asyncio.get_running_loop().remove_reader(worker.process.sentinel)
            self._retire(worker)
            return
        self._lose(worker, "crashed", f"exited with code {code}")

    def _lose(self, worker: Worker, reason: str, detail: str) -> None:
        if worker.lost:
            return
        worker.lost = True
        lost = sorted(worker.sessions)
        self.sessions_lost += len(lost)
        self.restarts[reason] += 1
        logger.error(
            "%s (pid %s) %s: %d call(s) lost%s; starting a new worker",
            worker.name,
            worker.process.pid,
            detail,
            len(lost),
            f" ({', '.join(lost)})" if lost else "",
        )
        if worker.process.is_alive():
            self._signal(worker, signal.SIGKILL)
        self._retire(worker)
        self._release(worker)
        if self.workers[worker.index] is worker and not self.stopping:
            self._spawn(worker.index)

    def _retire(self, worker: Worker) -> None:
        """Keep what the worker did in the server's totals; free its sessions' slots."""
        if worker.state and "retired" not in worker.state:
            worker.state["retired"] = True
            self.retired["process_cpu_s"] += float(worker.state.get("process_cpu_s", 0.0))
            self.retired["frames_sent_total"] += int(worker.state.get("frames_sent_total", 0))
        worker.sessions.clear()
        worker.reserved = 0
        worker.ready = False

    async def _watch(self) -> None:
        while True:
            await asyncio.gather(*(self._check(w) for w in self.workers if w is not None and not w.lost))
            await asyncio.sleep(HEALTH_INTERVAL_S)

    async def _check(self, worker: Worker) -> None:
        asked_s = time.monotonic()
        state = await self.fetch_state(worker)
        now = time.monotonic()
        if state is None:
            silent_s = now - worker.last_seen_s
            starting = not worker.ready and now - worker.started_s < START_TIMEOUT_S
            if not starting and silent_s > self.settings.worker_hang_timeout_s and worker.process.is_alive():
                self._lose(worker, "hung", f"answered no health check for {silent_s:.1f} s (killed)")
            return
        if worker.lost:
            return
        worker.last_seen_s = now
        worker.state = state
        worker.ready = bool(state.get("ready"))
        live = set(state.get("sessions", []))
        for session_id, learnt_s in list(worker.sessions.items()):
            if session_id not in live and learnt_s < asked_s:
                del worker.sessions[session_id]  # ended in the worker (hung up, timed out, failed)

    async def fetch_state(self, worker: Worker) -> dict[str, Any] | None:

        try:
            timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
            async with worker.http.get(f"http://worker{STATE_PATH}", timeout=timeout) as response:
                if response.status != 200:
                    return None
                return dict(await response.json())
        except (TimeoutError, aiohttp.ClientError, ValueError, RuntimeError):
            return None

    # -- placement and routing ------------------------------------------------------------------------------

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w is not None and not w.lost]

    @property
    def sessions_total(self) -> int:
        return sum(w.load for w in self.live())

    def reserve(self) -> Worker:
        """The ready worker with the fewest calls, its slot held until :meth:`release`; or 503."""
        if self.draining:
            self.refused["draining"] += 1
            raise CapacityError("the server is shutting down; try another instance", RETRY_AFTER_S)
        max_sessions = self.settings.max_sessions
        if self.sessions_total >= max_sessions:
            self.refused["capacity"] += 1
            raise CapacityError(f"all {max_sessions} sessions are in use; try again later", RETRY_AFTER_S)
        ready = [w for w in self.live() if w.ready]
        if not ready:
            self.refused["no_worker"] += 1
            raise CapacityError("no media worker is ready; try again shortly", RETRY_AFTER_S)
        worker = place_call(ready, self.live())
        worker.reserved += 1
        return worker

    def engine_load(self, engine_index: int) -> int:
        """Calls (and reserved slots) of the live workers bound to one engine."""
        return engine_load(self.live(), engine_index)

    def release(self, worker: Worker, session_id: str | None) -> None:
        worker.reserved = max(0, worker.reserved - 1)
        if session_id is not None and not worker.lost:
            worker.sessions[session_id] = time.monotonic()

    def owner(self, session_id: str) -> Worker:
        for worker in self.live():
            if session_id in worker.sessions:
                return worker
        raise NotFoundError(f"no session {session_id!r}")

    def forget(self, session_id: str) -> None:
        for worker in self.live():
            worker.sessions.pop(session_id, None)
