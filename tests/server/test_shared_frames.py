"""A caller, two WHEP viewers and the virtual camera on one session: each tick is composed once for all."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter

import numpy as np
import pytest

from pipeline import compositing
from pipeline.backend import RenderedPatch
from server.app import create_app
from server.config import Settings
from server.probe.wish import open_publisher, open_viewer
from server.state import RUNTIME
from server.virtualcam import VirtualCamera, newest_live_stream
from tests.fakes import speech_pattern, to_int16

pytestmark = [pytest.mark.usefixtures("loopback_ice"), pytest.mark.slow]


class FakeCamera:
    def __init__(self) -> None:
        self.frames = 0

    def send(self, frame: np.ndarray) -> None:
        self.frames += 1

    def close(self) -> None:
        pass


class PasteCounter:
    """Counts the real compositor's calls per rendered patch, wherever a module imported it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: Counter[int] = Counter()
        self._patches: list[RenderedPatch] = []  # kept alive, so that no two share an id()
        real = compositing.paste_patch

        def counting(base: np.ndarray, patch: RenderedPatch, mix: float = 1.0) -> np.ndarray:
            if id(patch) not in self.counts:
                self._patches.append(patch)
            self.counts[id(patch)] += 1
            return real(base, patch, mix)

        for module in list(sys.modules.values()):
            if getattr(module, "paste_patch", None) is real:
                monkeypatch.setattr(module, "paste_patch", counting)


async def test_one_composite_per_tick_for_every_consumer(aiohttp_client, monkeypatch) -> None:
    pastes = PasteCounter(monkeypatch)
    client = await aiohttp_client(create_app(Settings()))
    url = str(client.make_url("")).rstrip("/")
    runtime = client.app[RUNTIME]
    avatar = runtime.sessions.avatar(None)
    camera = FakeCamera()
    feed = VirtualCamera(
        camera,
        lambda: newest_live_stream(runtime.sessions),
        avatar.frames[0],
        runtime.sessions.clock,
        width=avatar.width,
        height=avatar.height,
    )
    feed.start()
    # Speech starts late enough for the viewers to have joined on a busy machine, then many onsets.
    syllables = [("speech", 0.24), ("silence", 0.24)] * 5
    sent = to_int16(speech_pattern([("silence", 1.5), *syllables, ("silence", 0.3)]))
    caller = await open_publisher(client.session, url, sent, signalling="offer")
    viewers = []
    try:
        await caller.wait_connected()
        viewers = [await open_viewer(client.session, url, caller.session_id) for _ in range(2)]
        for viewer in viewers:
            await viewer.wait_connected()
        assert caller.source is not None
        await caller.source.done.wait()
        await asyncio.sleep(0.3)
        session = runtime.sessions.get(caller.session_id)
        assert feed.following == session.id and session.viewers.stats_json()["count"] == 2
        stream = session.stream
    finally:
        for viewer in viewers:
            await viewer.close()
        await caller.close()
        await feed.stop()

    # The ticks that every consumer was sent with a finished render: each had its patch pasted once.
    metas = [{m["frame"]: m for _, m in peer.meta} for peer in (caller, *viewers)]
    common = set(metas[0]).intersection(*metas[1:])
    rendered = [k for k in common if all(m[k]["active"] and not m[k]["late"] for m in metas)]
    assert len(rendered) >= 5, (len(common), len(rendered))
    times_pasted = Counter(pastes.counts.values())  # composed per consumer, each patch was pasted 3 times
    assert set(times_pasted) == {1}, times_pasted
    composed = stream.frames.stats
    assert len(pastes.counts) == composed.pasted
    # At most one composite per tick, the rest shared (the viewers' encoder and the camera ask too).
    assert composed.composed <= stream.stats.ticks
    assert composed.shared >= len(common), (composed, len(common))
    assert camera.frames >= len(common) // 2
    # Same frame, same facts, for the caller and the viewers: late or not, and the one composite's time.
    for k in common:
        assert len({(m[k]["late"], m[k]["stages_ms"]["compose"]) for m in metas}) == 1, k
