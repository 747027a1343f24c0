"""Runs in a **media worker**: the process entry point (the front starts it with ``multiprocessing``).

Signals: the front sends SIGTERM to drain (the worker stops taking calls, lets its calls go on for up to
``drain_timeout_s``, then closes them and exits); a second SIGTERM closes its calls at once. SIGINT is
ignored (Ctrl-C reaches the whole process group; the front decides). A worker whose front is gone (its
parent changed, or the engine link closed) closes its calls and exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from lipcast.server.worker.messages import WorkerSpec

logger = logging.getLogger(__name__)

PARENT_CHECK_S = 1.0


def run_worker(spec: WorkerSpec) -> None:
    """``multiprocessing`` target: serve this worker's sessions until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=getattr(logging, spec.settings.log_level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s worker-{spec.index} %(name)s: %(message)s",
    )
    logging.getLogger("aioice").setLevel(logging.WARNING)
    logging.getLogger("aiortc").setLevel(logging.WARNING)
    from lipcast.streaming.memory import keep_frame_buffers_in_heap

    keep_frame_buffers_in_heap()  # per-frame buffers from the heap, not fresh pages (streaming/memory.py)
    import cv2

    # A worker's pictures are small (320x320) and the workers already fill the cores: OpenCV's own pool only
    # spins (H200 box, 12 workers with 2 calls each: its threads took 0.30 cores a worker).
    cv2.setNumThreads(1)
    if spec.settings.ice_addresses:
        from lipcast.streaming.rtc import restrict_host_addresses

        restrict_host_addresses(spec.settings.ice_addresses)  # aioice binds in this process
    asyncio.run(_serve(spec))


async def _serve(spec: WorkerSpec) -> None:
    from lipcast.server.process_app import create_process_app
    from lipcast.server.serve import serve_until_signalled
    from lipcast.server.worker.messages import STATE_PATH
    from lipcast.server.worker.runtime import WORKER_SPEC, runtime_builder, worker_state

    loop = asyncio.get_running_loop()
    abort = asyncio.Event()

    def engine_lost() -> None:
        logger.error("the render engine's link closed: closing this worker's calls")
        loop.call_soon_threadsafe(abort.set)

    app = create_process_app(spec.settings, runtime_builder=runtime_builder(spec, engine_lost))
    app[WORKER_SPEC] = spec
    app.router.add_get(STATE_PATH, worker_state)

    async def watch_parent() -> None:
        # Nothing tells a child its parent has gone except its new parent id: look once a second.
        while os.getppid() == spec.parent_pid:  # noqa: ASYNC110
            await asyncio.sleep(PARENT_CHECK_S)
        logger.error("the front process is gone: closing this worker's calls")
        abort.set()

    watcher = asyncio.create_task(watch_parent())
    try:
        await serve_until_signalled(
            app, "", 0, spec.settings.drain_timeout_s, unix_path=spec.socket_path, abort=abort
        )
    finally:
        watcher.cancel()
    logger.info("worker %d stopped", spec.index)
