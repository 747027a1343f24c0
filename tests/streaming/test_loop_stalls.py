"""The event-loop stall watchdog: a blocked loop is reported once, with its length and where it was."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import pytest

from lipcast.streaming.loop_stalls import GcPauses, LoopStallWatch, Stall, freeze_startup_heap


def _block_here(seconds: float) -> None:
    time.sleep(seconds)  # a blocking call on the loop's thread: what the watchdog must catch


async def _stalls_of_one_block(block_s: float) -> tuple[LoopStallWatch, list[Stall]]:
    """A watch at 60 ms around a loop that blocks once for ``block_s``."""
    seen: list[Stall] = []
    watch = LoopStallWatch(60.0, beat_ms=5.0, on_stall=seen.append)
    watch.start()
    try:
        await asyncio.sleep(0.05)
        _block_here(block_s)
        await asyncio.sleep(0.05)
    finally:
        watch.stop()
    return watch, seen


async def test_a_blocked_loop_is_reported_with_its_length_and_stack() -> None:
    watch, seen = await _stalls_of_one_block(0.25)
    assert len(seen) == 1, seen
    # At least the time blocked minus one beat; a loaded machine may add, never remove.
    assert seen[0].duration_ms >= 240.0
    assert "_block_here" in seen[0].stack
    assert watch.stalls == seen


async def test_a_loop_that_keeps_running_reports_nothing() -> None:
    seen: list[Stall] = []
    watch = LoopStallWatch(500.0, beat_ms=5.0, on_stall=seen.append)
    watch.start()
    try:
        for _ in range(20):
            _block_here(0.01)  # short callbacks: each well under the threshold
            await asyncio.sleep(0.005)
    finally:
        watch.stop()
    assert seen == []


def test_the_threshold_must_exceed_the_beat() -> None:
    with pytest.raises(ValueError):
        LoopStallWatch(10.0, beat_ms=10.0)


async def test_the_report_says_where_the_other_threads_were() -> None:
    release = threading.Event()
    other = threading.Thread(target=release.wait, name="busy-neighbour", daemon=True)
    other.start()
    try:
        _, seen = await _stalls_of_one_block(0.2)
    finally:
        release.set()
    assert len(seen) == 1
    assert "other thread busy-neighbour:" in seen[0].stack


async def test_a_stall_in_garbage_collection_says_so(caplog: pytest.LogCaptureFixture) -> None:
    # Enough tracked objects that a full collection of them blocks well past the threshold.
    heap = [[i] for i in range(400_000)]
    for cell in heap:
        cell.append(cell)  # each a cycle: only the cyclic collector could free them
    seen: list[Stall] = []
    watch = LoopStallWatch(20.0, beat_ms=5.0, on_stall=seen.append)
    caplog.set_level(logging.WARNING, logger="lipcast.streaming.loop_stalls")
    watch.start()
    try:
        await asyncio.sleep(0.05)
        gc.collect()
        await asyncio.sleep(0.05)
    finally:
        watch.stop()
        del heap
    collected = [stall for stall in seen if stall.gc_generation == 2]
    assert collected, seen
    assert 0 < collected[0].gc_ms <= collected[0].duration_ms + 5.0
    assert "in garbage collection, generation 2" in caplog.text
    assert watch.gc_pauses._on_gc not in gc.callbacks  # stopped: the callback is gone


def test_gc_pauses_are_summed_over_a_window() -> None:
    pauses = GcPauses()
    pauses._pauses.extend([(1.00, 1.03, 0), (1.10, 1.15, 2), (2.00, 2.01, 1)])
    total_s, oldest = pauses.within(1.02, 1.2)
    assert total_s == pytest.approx(0.01 + 0.05) and oldest == 2
    assert pauses.within(1.5, 1.9) == (0.0, None)


def test_the_startup_heap_is_frozen_out_of_the_collector() -> None:
    try:
        assert freeze_startup_heap() >= 0.0
        assert gc.get_freeze_count() > 1000  # pytest, numpy and the server's modules at least
    finally:
        gc.unfreeze()
