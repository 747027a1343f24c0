"""The shared-memory link between media workers and the one render engine, with a fake backend.

Two workers' links (each a ring plus a pipe) feed one engine: every session gets back exactly its own frames,
in the order it submitted them, batched together with the other link's; deadlines, cancellation and a worker
that goes away behave as on a local engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, wait
from multiprocessing import Pipe

import numpy as np
import pytest

from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.engine import DeadlineExpiredError, EngineStoppedError, RenderEngine
from lipcast.pipeline.engine_link.bridge import EngineBridge
from lipcast.pipeline.engine_link.client import RingFullError, SharedRenderer
from lipcast.pipeline.engine_link.ring import Ring, RingError, RingLayout, hang_up
from tests.fakes import FakeBackend, tiny_avatar
from tests.pipeline.test_engine import SlowBackend

LAYOUT = RingLayout(slots=256, conditioning_shape=(2,), max_patch_bytes=4 * 4 * 3)
SMALL = RingLayout(slots=8, conditioning_shape=(2,), max_patch_bytes=4 * 4 * 3)


class TaggingBackend(SlowBackend):
    """A 2x3 patch that carries (frame index, session tag, position in the batch); top = frame index."""

    @property
    def conditioning_shape(self) -> tuple[int, ...]:
        return (2,)

    def render(self, items):  # type: ignore[override]
        self.gate.wait()
        time.sleep(self.delay_s)
        self.batches.append(list(items))
        out = []
        for i, item in enumerate(items):
            pixels = np.zeros((2, 3, 3), np.uint8)
            pixels[0, 0] = (item.frame_index % 256, int(item.conditioning[0]), i)
            pixels[1, 2] = (int(item.conditioning[1]), 7, 9)
            out.append(RenderedPatch(pixels, top=item.frame_index, left=int(item.conditioning[0])))
        return out


def link(
    engine: RenderEngine, link_id: str, layout: RingLayout = LAYOUT
) -> tuple[EngineBridge, SharedRenderer]:
    engine_end, worker_end = Pipe()
    bridge = EngineBridge(engine, layout, engine_end, link_id)
    bridge.start()
    renderer = SharedRenderer(layout, bridge.shm_name, worker_end)
    renderer.start()
    return bridge, renderer


@pytest.fixture
def engine() -> Iterator[RenderEngine]:
    engine = RenderEngine(TaggingBackend(delay_s=0.004), (1, 2, 4, 8))
    engine.add_avatar(tiny_avatar())
    engine.start()
    yield engine
    engine.stop()


def item(frame: int, tag: int) -> RenderItem:
    return RenderItem("tiny", frame, np.array([tag, frame % 200], np.float32))


def test_ring_round_trip_and_limits() -> None:
    ring = Ring(LAYOUT, create=True)
    try:
        ring.write_request(3, "abcDEF123_-x", item(41, 5), deadline_s=12.5)
        session, got, deadline = ring.read_request(3)
        assert (session, got.avatar, got.frame_index, deadline) == ("abcDEF123_-x", "tiny", 41, 12.5)
        np.testing.assert_array_equal(got.conditioning, [5, 41])
        ring.write_request(4, "s", item(1, 1), deadline_s=None)
        assert ring.read_request(4)[2] is None
        patch = RenderedPatch(np.arange(2 * 4 * 3, dtype=np.uint8).reshape(2, 4, 3), 9, 11)
        ring.write_patch(3, patch)
        back = ring.read_patch(3)
        np.testing.assert_array_equal(back.pixels, patch.pixels)
        assert (back.top, back.left, back.box) == (9, 11, None)
        ring.write_patch(2, RenderedPatch(patch.pixels, 9, 11, box=(5, 9)))  # rendered smaller than its box
        assert ring.read_patch(2).box == (5, 9)
        with pytest.raises(RingError):
            ring.write_patch(0, RenderedPatch(np.zeros((5, 5, 3), np.uint8), 0, 0))
        with pytest.raises(RingError):
            ring.write_request(0, "s", RenderItem("tiny", 0, np.zeros(3, np.float32)), None)
        with pytest.raises(RingError):
            ring.write_request(0, "x" * 17, item(0, 0), None)
    finally:
        ring.close()


def test_frames_of_two_workers_come_back_to_their_sessions_in_order(engine: RenderEngine) -> None:
    links = [link(engine, "w0"), link(engine, "w1")]
    try:
        futures: dict[tuple[int, int], list[Future[RenderedPatch]]] = {}
        completion: dict[tuple[int, int], list[int]] = {}
        rng = np.random.default_rng(1)
        counts = {(w, s): 0 for w in range(2) for s in range(3)}
        for _ in range(240):
            w, s = int(rng.integers(0, 2)), int(rng.integers(0, 3))
            key = (w, s)
            frame = counts[key]
            counts[key] += 1
            future = links[w][1].submit(f"sess{s}", item(frame, 10 * w + s))
            record = completion.setdefault(key, [])
            future.add_done_callback(lambda f, record=record, frame=frame: record.append(frame))
            futures.setdefault(key, []).append(future)
            if frame % 5 == 0:
                time.sleep(0.002)  # let batches of mixed sizes form
        done, pending = wait([f for fs in futures.values() for f in fs], timeout=30)
        assert not pending
        for (w, s), fs in futures.items():
            for frame, future in enumerate(fs):
                patch = future.result()
                assert patch.top == frame and patch.left == 10 * w + s
                assert tuple(patch.pixels[0, 0, :2]) == (frame % 256, 10 * w + s)
                assert tuple(patch.pixels[1, 2]) == (frame % 200, 7, 9)
            assert completion[(w, s)] == sorted(completion[(w, s)]), "frames resolved out of order"
        batches = engine.backend.batches  # type: ignore[attr-defined]
        assert any(len({int(i.conditioning[0]) // 10 for i in b}) == 2 for b in batches), (
            "no batch mixed the two workers' frames"
        )
        assert all(r.queue_depth == 0 for _, r in links)  # every slot came back
    finally:
        for bridge, renderer in links:
            renderer.stop()
            bridge.close()


def test_deadline_cancel_and_full_ring(engine: RenderEngine) -> None:
    bridge, renderer = link(engine, "w0", SMALL)
    backend = engine.backend
    try:
        late = renderer.submit("a", item(0, 1), deadline_s=time.monotonic() - 1.0)
        with pytest.raises(DeadlineExpiredError):
            late.result(timeout=10)
        backend.gate.clear()  # type: ignore[attr-defined]  # hold the engine so frames queue up
        first = renderer.submit("a", item(1, 1))
        time.sleep(0.05)  # the engine has taken `first` and waits at the gate
        queued = [renderer.submit("b", item(i, 2)) for i in range(SMALL.slots - 1)]
        full = renderer.submit("c", item(0, 3))
        assert isinstance(full.exception(timeout=1), RingFullError)
        assert renderer.cancel_session("b") == SMALL.slots - 1
        backend.gate.set()  # type: ignore[attr-defined]
        assert first.result(timeout=10).top == 1
        assert all(f.cancelled() for f in queued)
        deadline = time.monotonic() + 10
        while renderer.queue_depth and time.monotonic() < deadline:
            time.sleep(0.01)
        assert renderer.queue_depth == 0  # the cancelled frames' slots came back
        assert renderer.submit("c", item(1, 3)).result(timeout=10).top == 1
    finally:
        backend.gate.set()  # type: ignore[attr-defined]
        renderer.stop()
        bridge.close()


def test_a_vanished_worker_frees_its_frames_and_the_other_link_goes_on(engine: RenderEngine) -> None:
    (bridge0, renderer0), (bridge1, renderer1) = link(engine, "w0"), link(engine, "w1")
    closed: list[str] = []
    bridge0.on_closed = lambda b: closed.append(b.link_id)
    backend = engine.backend
    try:
        backend.gate.clear()  # type: ignore[attr-defined]
        for i in range(6):
            renderer0.submit("gone", item(i, 1))
        hang_up(renderer0.conn)  # what a killed worker leaves: its end of the pipe closes
        deadline = time.monotonic() + 10
        while not closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert closed == ["w0"]
        backend.gate.set()  # type: ignore[attr-defined]
        assert renderer1.submit("alive", item(3, 2)).result(timeout=10).top == 3
        assert engine.queue_depth == 0
    finally:
        backend.gate.set()  # type: ignore[attr-defined]
        for bridge, renderer in ((bridge0, renderer0), (bridge1, renderer1)):
            renderer.stop()
            bridge.close()


def test_the_worker_side_fails_pending_frames_when_the_engine_goes_away(engine: RenderEngine) -> None:
    bridge, renderer = link(engine, "w0")
    lost: list[bool] = []
    renderer.on_lost = lambda: lost.append(True)
    engine.backend.gate.clear()  # type: ignore[attr-defined]
    try:
        pending = renderer.submit("a", item(0, 1))
        bridge.close()
        with pytest.raises(EngineStoppedError):
            pending.result(timeout=10)
        deadline = time.monotonic() + 5
        while not lost and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lost and not renderer.running
        assert isinstance(renderer.submit("a", item(1, 1)).exception(timeout=1), EngineStoppedError)
    finally:
        engine.backend.gate.set()  # type: ignore[attr-defined]
        renderer.stop()


def test_fake_backend_is_still_usable_directly() -> None:
    assert FakeBackend().conditioning_shape == (1,)
