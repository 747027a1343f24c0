"""Waiting for something to happen in a test: bounded by a generous timeout, never by a guess at how fast.

A busy 2-core machine can take far longer than an idle one to schedule a thread, close a peer connection or
run a timer; a test waits for the condition itself (up to ``timeout_s``) instead of sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEFAULT_TIMEOUT_S = 15.0
POLL_S = 0.05


async def eventually(
    condition: Callable[[], object], what: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Return once ``condition()`` is true; fail with ``what`` if it is still false after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout_s:g} s")
        await asyncio.sleep(POLL_S)
