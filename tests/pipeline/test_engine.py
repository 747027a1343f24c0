"""The render engine: cross-session batching, order, padding to fixed sizes, deadlines, failures."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, wait

import numpy as np
import pytest

from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.engine import DeadlineExpiredError, EngineStoppedError, RenderEngine, bucket_for
from tests.fakes import FakeBackend, tiny_avatar


class SlowBackend(FakeBackend):
    """Renders slowly so requests pile up and get batched; the patch encodes (level, frame index)."""

    def __init__(self, delay_s: float = 0.02) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.gate = threading.Event()
        self.gate.set()

    def render(self, items):  # type: ignore[override]
        self.gate.wait()
        time.sleep(self.delay_s)
        self.batches.append(list(items))
        return [
            RenderedPatch(np.array([[[item.frame_index, int(item.conditioning[0]), 0]]], np.uint8), 0, 0)
            for item in items
        ]


def item(frame: int, value: int = 0) -> RenderItem:
    return RenderItem("tiny", frame, np.array([value], np.float32))


def until_taken(engine: RenderEngine, timeout_s: float = 10.0) -> None:
    """Wait until the worker has taken everything queued (however slowly a busy machine schedules it)."""
    deadline = time.monotonic() + timeout_s
    while engine.queue_depth:
        assert time.monotonic() < deadline, "the worker never took its work"
        time.sleep(0.005)


def make_engine(backend, sizes=(1, 2, 4, 8)) -> RenderEngine:
    engine = RenderEngine(backend, sizes)
    engine.add_avatar(tiny_avatar())
    engine.start()
    return engine


def test_bucket_for() -> None:
    assert [bucket_for(n, (1, 2, 4, 8)) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 8]


def test_each_session_gets_its_own_frames_in_order_under_mixed_load() -> None:
    backend = SlowBackend(delay_s=0.005)
    engine = make_engine(backend)
    try:
        futures: dict[int, list[Future[RenderedPatch]]] = {s: [] for s in range(5)}
        rng = np.random.default_rng(0)
        # The first half piles up behind a shut gate (so batches certainly mix sessions, however the machine
        # schedules the threads); the second half arrives while the worker renders.
        backend.gate.clear()
        for step in range(200):
            if step == 100:
                backend.gate.set()
            session = int(rng.integers(0, 5))
            futures[session].append(engine.submit(f"s{session}", item(len(futures[session]), session)))
            if step % 17 == 0:
                time.sleep(0.003)
        wait([f for fs in futures.values() for f in fs], timeout=30)
        for session, fs in futures.items():
            got = [f.result().pixels[0, 0].tolist() for f in fs]
            assert got == [[i, session, 0] for i in range(len(fs))]
        sizes = {len(b) for b in backend.batches}
        assert sizes <= {1, 2, 4, 8} and max(sizes) > 1  # padded to fixed sizes, and batched across sessions
        assert engine.stats.frames == 200
        mixed = [b for b in backend.batches if len({int(i.conditioning[0]) for i in b}) > 1]
        assert mixed, "no batch mixed sessions"
    finally:
        engine.stop()


def test_requests_past_their_deadline_are_dropped_not_rendered() -> None:
    backend = SlowBackend()
    backend.gate.clear()
    engine = make_engine(backend, sizes=(1,))
    try:
        first = engine.submit("s", item(0))  # occupies the worker while the gate is shut
        until_taken(engine)
        late = engine.submit("s", item(1), deadline_s=time.monotonic() + 0.01)
        on_time = engine.submit("s", item(2), deadline_s=time.monotonic() + 10)
        time.sleep(0.05)
        backend.gate.set()
        assert first.result(5).pixels[0, 0, 0] == 0
        with pytest.raises(DeadlineExpiredError):
            late.result(5)
        assert on_time.result(5).pixels[0, 0, 0] == 2
        assert engine.stats.expired == 1
        assert all(i.frame_index != 1 for b in backend.batches for i in b)
    finally:
        engine.stop()


def test_a_failing_batch_fails_its_requests_and_the_engine_goes_on() -> None:
    backend = FakeBackend()
    engine = make_engine(backend)
    try:
        backend.fail_next = True
        with pytest.raises(RuntimeError, match="injected"):
            engine.submit("s", item(0)).result(5)
        assert engine.submit("s", item(1)).result(5).pixels.shape == (8, 8, 3)
        assert engine.stats.failed_batches == 1
    finally:
        engine.stop()


def test_cancel_session_and_stop_release_every_request() -> None:
    backend = SlowBackend()
    backend.gate.clear()
    engine = make_engine(backend, sizes=(1,))
    busy = engine.submit("a", item(0))
    until_taken(engine)
    queued_a = [engine.submit("a", item(i)) for i in range(1, 4)]
    queued_b = engine.submit("b", item(9))
    assert engine.cancel_session("a") == 3
    assert all(f.cancelled() for f in queued_a)
    backend.gate.set()
    busy.result(5)
    queued_b.result(5)
    engine.stop()
    assert engine.submit("b", item(1)).exception(1).__class__ is EngineStoppedError


def test_the_worker_thread_can_run_at_a_lower_priority() -> None:
    """On a CPU the renders yield to the media clock: the worker thread alone gets the niceness."""
    seen: list[int] = []

    class PriorityBackend(FakeBackend):
        def render(self, items):  # type: ignore[override]
            seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return super().render(items)

    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    engine = RenderEngine(PriorityBackend(), (1,), worker_niceness=5)
    engine.add_avatar(tiny_avatar())
    engine.start()
    try:
        engine.submit("s", item(0)).result(5)
    finally:
        engine.stop()
    assert seen == [5]  # an absolute niceness
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_the_worker_thread_runs_on_a_cuda_device_named_with_or_without_its_index(device: str) -> None:
    """The server's default device is plain "cuda": the worker thread must take it (it once died at start)."""
    from lipcast.pipeline.devices import resolve_devices

    assert all(d.index is not None for d in resolve_devices("cuda"))
    engine = RenderEngine(FakeBackend(), (1,), device=device)
    engine.add_avatar(tiny_avatar())
    engine.start()
    try:
        assert engine.submit("s", item(0)).result(10) is not None
        assert engine.running
    finally:
        engine.stop()


def test_a_worker_thread_that_fails_is_logged_and_fails_its_frames(caplog: pytest.LogCaptureFixture) -> None:
    # No such GPU here (a CPU build, or fewer GPUs): the thread's first step, making it current, fails.
    engine = RenderEngine(FakeBackend(), (1,), device="cuda:63")
    engine.start()
    assert engine._thread is not None
    engine._thread.join(10)
    assert not engine.running
    assert "render engine cuda:63 failed" in caplog.text
    with pytest.raises(EngineStoppedError):
        engine.submit("s", item(0)).result(1)
