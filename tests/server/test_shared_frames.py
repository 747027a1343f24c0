"""A caller, two WHEP viewers and the virtual camera on one session: each tick is composed once for all."""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pytest

from lipcast.pipeline import compositing
from lipcast.pipeline.backend import RenderedPatch
from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from lipcast.server.virtualcam import newest_session_feed
from tests.server.watched_call import syllables_after_silence, watched_call

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
    camera = FakeCamera()
    feed = newest_session_feed(camera, runtime.sessions)
    feed.start()
    try:
        async with watched_call(client.session, url, syllables_after_silence()) as (caller, viewers):
            session = runtime.sessions.get(caller.session_id)
            assert feed.following == session.id and session.viewers.stats_json()["count"] == 2
            stream = session.stream
    finally:
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
