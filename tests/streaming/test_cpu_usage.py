"""CPU per thread group from /proc (Linux), and the deltas the probe computes from two snapshots."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from lipcast.streaming.cpu_usage import cpu_delta, cpu_snapshot, thread_cpu_s, thread_group


def test_thread_names_are_grouped_without_running_numbers() -> None:
    assert thread_group("ThreadPoolExecutor-0_3") == "ThreadPoolExecutor"
    assert thread_group("asyncio_0") == "asyncio"
    assert thread_group("engine-bridge-w3.1") == "engine-bridge"
    assert thread_group("Thread-5 (spin)") == "spin"
    assert thread_group("render-engine") == "render-engine"
    assert thread_group("MainThread") == "MainThread"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread CPU comes from /proc")
def test_a_busy_thread_is_counted_under_its_name() -> None:
    done = threading.Event()

    def spin() -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.3:  # CPU time, however loaded the machine is
            pass
        done.wait(10)

    thread = threading.Thread(target=spin, name="spinner-1")
    before = cpu_snapshot()
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while thread_cpu_s().get("spinner", 0.0) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = cpu_snapshot()
    finally:
        done.set()
        thread.join()
    assert after["threads_cpu_s"]["spinner"] >= 0.25
    assert "MainThread" in after["threads_cpu_s"]
    delta = cpu_delta(before, after)
    assert delta["cpu_s"] >= 0.25
    assert delta["threads_cores_busy"]["spinner"] > 0
    assert next(iter(delta["threads_cores_busy"])) == "spinner"  # busiest first


def test_delta_of_two_snapshots() -> None:
    before = {"process_cpu_s": 1.0, "monotonic_s": 10.0, "threads_cpu_s": {"MainThread": 0.5, "gone": 0.2}}
    after = {"process_cpu_s": 3.0, "monotonic_s": 14.0, "threads_cpu_s": {"MainThread": 1.5, "new": 0.4}}
    delta = cpu_delta(before, after)
    assert delta["cpu_s"] == 2.0 and delta["wall_s"] == 4.0 and delta["cores_busy"] == 0.5
    assert delta["threads_cores_busy"] == {"MainThread": 0.25, "new": 0.1}  # a new group counts from zero
