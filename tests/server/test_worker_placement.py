"""Where the front puts a new call: the engine (GPU) with the most headroom, then its least-loaded worker."""

from __future__ import annotations

from typing import Any

from lipcast.server.front.pool import Worker, place_call


def worker(index: int, engine: int, calls: int, *, ready: bool = True) -> Worker:
    w = Worker(index, 1, process=Any, socket_path="", http=Any, bridge=None, engine_index=engine)  # type: ignore[arg-type]
    w.sessions = {f"w{index}-{i}": 0.0 for i in range(calls)}
    w.ready = ready
    return w


def test_one_engine_means_the_least_loaded_worker() -> None:
    workers = [worker(0, 0, 2), worker(1, 0, 1), worker(2, 0, 1)]
    assert place_call(workers, workers).index == 1


def test_the_engine_with_the_fewest_calls_comes_first() -> None:
    # Engine 0 serves 3 calls (worker 0 idle, worker 2 busy), engine 1 serves 2: the call goes to engine 1,
    # although worker 0 alone has the fewest calls.
    workers = [worker(0, 0, 0), worker(1, 1, 1), worker(2, 0, 3), worker(3, 1, 1)]
    assert place_call(workers, workers).index == 1


def test_a_worker_not_ready_still_counts_for_its_engine() -> None:
    starting = worker(1, 1, 0, ready=False)
    live = [worker(0, 0, 2), starting, worker(2, 1, 2)]
    ready = [w for w in live if w.ready]
    assert place_call(ready, live).index == 0  # engine 0: 2 calls, engine 1: 2 (its worker 1 not ready)
