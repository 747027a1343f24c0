"""Running the server with a graceful shutdown.

On the first SIGTERM or SIGINT the server drains: it stops taking calls (``/readyz`` answers 503, offers get
503), lets live calls go on for up to ``drain_timeout_s`` while still answering their HTTP requests (a
client can end its call), then closes what is left and exits. A second signal skips the rest of the wait.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Protocol

from aiohttp import web

from lipcast.server.state import METRICS, RUNTIME, SETTINGS
from lipcast.streaming.loop_stalls import LoopStallWatch, freeze_startup_heap

logger = logging.getLogger(__name__)


class Drainable(Protocol):
    """More calls to drain on SIGTERM than the app's own sessions (the front's media workers)."""

    async def drain(self, timeout_s: float) -> int: ...

    async def close_all(self, reason: str) -> None: ...


ALSO_DRAIN = web.AppKey("also_drain", Drainable)


async def serve_until_signalled(
    app: web.Application,
    host: str,
    port: int,
    drain_timeout_s: float,
    *,
    unix_path: str | None = None,
    abort: asyncio.Event | None = None,
) -> None:
    """Serve on ``host:port`` (or the Unix socket ``unix_path``) until SIGTERM/SIGINT, then drain.

    ``abort`` set: close every call now and stop (a media worker whose front went away).
    """
    # A media worker's requests come from the front, which logs them already.
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None if unix_path else logging.getLogger("aiohttp.access")
    )
    await runner.setup()
    freeze_startup_heap()  # what startup made lives as long as the process: no collection walks it again
    stalls = _watch_stalls(app)  # from here on: startup (a build thread holding the GIL) is not a stall
    watch: asyncio.Task[None] | None = None
    try:
        if unix_path is not None:
            await web.UnixSite(runner, unix_path).start()
        else:
            await web.TCPSite(runner, host, port).start()
        loop = asyncio.get_running_loop()
        stop, hurry = asyncio.Event(), asyncio.Event()
        if abort is not None:

            async def on_abort() -> None:
                await abort.wait()
                hurry.set()
                stop.set()

            watch = asyncio.create_task(on_abort())

        def on_signal(signum: signal.Signals) -> None:
            if stop.is_set():
                logger.info("%s again: closing every call now", signum.name)
                hurry.set()
            else:
                logger.info("%s: draining (up to %g s)", signum.name, drain_timeout_s)
                stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        await stop.wait()
        runtime = app.get(RUNTIME)
        others = app.get(ALSO_DRAIN)
        if runtime is not None:
            drains = [runtime.sessions.drain(drain_timeout_s)]
            if others is not None:
                drains.append(others.drain(drain_timeout_s))
            drain = asyncio.gather(*drains)
            hurried = asyncio.create_task(hurry.wait())
            await asyncio.wait((drain, hurried), return_when=asyncio.FIRST_COMPLETED)
            hurried.cancel()
            if not drain.done():
                drain.cancel()
                await asyncio.gather(drain, return_exceptions=True)
                await runtime.sessions.close_all("server shutdown")
                if others is not None:
                    await others.close_all("server shutdown")
    finally:
        if watch is not None:
            watch.cancel()
        await runner.cleanup()
        if stalls is not None:
            stalls.stop()


def _watch_stalls(app: web.Application) -> LoopStallWatch | None:
    """The stall watchdog of this process's loop while it serves, feeding the app's metrics."""
    settings, metrics = app.get(SETTINGS), app.get(METRICS)
    if settings is None or not settings.loop_stall_ms:
        return None
    watch = LoopStallWatch(
        settings.loop_stall_ms,
        on_stall=metrics.observe_stall if metrics is not None else None,
    )
    watch.start()
    return watch
