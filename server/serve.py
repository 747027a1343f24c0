"""Running the server with a graceful shutdown.

On the first SIGTERM or SIGINT the server drains: it stops taking calls (``/readyz`` answers 503, offers get
503), lets live calls go on for up to ``drain_timeout_s`` while still answering their HTTP requests (a
client can end its call), then closes what is left and exits. A second signal skips the rest of the wait.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from server.state import RUNTIME

logger = logging.getLogger(__name__)


async def serve_until_signalled(app: web.Application, host: str, port: int, drain_timeout_s: float) -> None:
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        loop = asyncio.get_running_loop()
        stop, hurry = asyncio.Event(), asyncio.Event()

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
        if runtime is not None:
            drain = asyncio.create_task(runtime.sessions.drain(drain_timeout_s))
            hurried = asyncio.create_task(hurry.wait())
            await asyncio.wait((drain, hurried), return_when=asyncio.FIRST_COMPLETED)
            hurried.cancel()
            if not drain.done():
                drain.cancel()
                await asyncio.gather(drain, return_exceptions=True)
                await runtime.sessions.close_all("server shutdown")
    finally:
        await runner.cleanup()
