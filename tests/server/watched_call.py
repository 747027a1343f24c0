"""A call watched by WHEP viewers, for the tests of what a session's consumers share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import numpy as np
import numpy.typing as npt

from lipcast.probe.wish import Peer, open_publisher, open_viewer
from tests.fakes import speech_pattern, to_int16


def syllables_after_silence(lead_s: float = 2.0) -> npt.NDArray[np.int16]:
    """Silence long enough for viewers to join on a busy machine (~1.5 s after the caller), then five
    syllables: many onsets, so the mouth moves a lot."""
    syllables = [("speech", 0.24), ("silence", 0.24)] * 5
    return to_int16(speech_pattern([("silence", lead_s), *syllables, ("silence", 0.3)]))


@asynccontextmanager
async def watched_call(
    http: aiohttp.ClientSession, url: str, sent: npt.NDArray[np.int16], *, viewers: int = 2
) -> AsyncIterator[tuple[Peer, list[Peer]]]:
    """A call page caller sending ``sent`` and ``viewers`` WHEP viewers of its session; yields once all of
    the audio was sent (and 0.3 s more), closes them all afterwards."""
    caller = await open_publisher(http, url, sent, signalling="offer")
    opened: list[Peer] = []
    try:
        await caller.wait_connected()
        opened = [await open_viewer(http, url, caller.session_id) for _ in range(viewers)]
        for viewer in opened:
            await viewer.wait_connected()
        assert caller.source is not None
        await caller.source.done.wait()
        await asyncio.sleep(0.3)
        yield caller, opened
    finally:
        for viewer in opened:
            await viewer.close()
        await caller.close()
