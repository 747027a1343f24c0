"""One engine per device: sessions spread over the engines, each session's frames on one engine in order."""

from __future__ import annotations

from concurrent.futures import Future, wait

import numpy as np
import pytest
import torch

from lipcast.pipeline.backend import RenderedPatch
from lipcast.pipeline.devices import resolve_devices
from lipcast.pipeline.engine import RenderEngine
from lipcast.pipeline.engine_group import EngineGroup, summed_stats
from tests.fakes import tiny_avatar
from tests.pipeline.test_engine import SlowBackend, item


def group_of(count: int) -> tuple[EngineGroup, list[SlowBackend]]:
    backends = [SlowBackend(delay_s=0.002) for _ in range(count)]
    engines = [RenderEngine(b, (1, 2, 4), device="cpu") for b in backends]
    group = EngineGroup(engines)
    group.add_avatar(tiny_avatar())
    return group, backends


def test_sessions_spread_over_the_engines_and_keep_their_frames_on_one() -> None:
    group, backends = group_of(2)
    assert group.has_avatar("tiny") and all(b.avatars for b in backends)  # prepared on every device
    assert group.devices == ["cpu/0", "cpu/1"]
    group.start()
    try:
        futures: dict[int, list[Future[RenderedPatch]]] = {s: [] for s in range(4)}
        for step in range(80):
            session = step % 4
            futures[session].append(group.submit(f"s{session}", item(len(futures[session]), session)))
        wait([f for fs in futures.values() for f in fs], timeout=30)
        for session, fs in futures.items():  # every frame back, to its own session, in order
            assert [f.result().pixels[0, 0].tolist() for f in fs] == [[i, session, 0] for i in range(20)]
        # The first sessions went to the engine with the fewest: s0, s2 on one, s1, s3 on the other ...
        on_engine = [{int(i.conditioning[0]) for batch in b.batches for i in batch} for b in backends]
        assert on_engine == [{0, 2}, {1, 3}]  # ... and every frame of a session on its engine
        assert [d["sessions"] for d in group.per_device()] == [2, 2]
        assert group.stats.frames == 80 == sum(e.stats.frames for e in group.engines)
        # A session that ended frees its place: the next new one goes where there is room.
        group.cancel_session("s1")
        assert group.engine_of("new") is group.engines[1]
    finally:
        group.stop()
    assert not group.running


def test_warmup_reports_the_slowest_engine_and_counters_add_up() -> None:
    group, _ = group_of(2)
    timings = group.warmup(repeats=1)
    assert set(timings) == {1, 2, 4} and group.warmup_s is not None
    a, b = (e.stats for e in group.engines)
    a.frames, b.frames, a.batch_size_counts, b.batch_size_counts = 3, 4, {1: 2}, {1: 1, 4: 1}
    total = summed_stats([a, b])
    assert total.frames == 7 and total.batch_size_counts == {1: 3, 4: 1}


def test_engines_must_share_their_buckets() -> None:
    with pytest.raises(ValueError, match="batch sizes"):
        EngineGroup([RenderEngine(SlowBackend(), (1, 2)), RenderEngine(SlowBackend(), (1, 4))])
    with pytest.raises(ValueError):
        EngineGroup([])


def test_devices_from_the_gpus_setting() -> None:
    assert resolve_devices("cpu") == [torch.device("cpu")]
    assert resolve_devices("auto", ("cpu", "cpu")) == [torch.device("cpu")] * 2
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            resolve_devices("auto", ("0", "1"))
    else:
        with pytest.raises(RuntimeError, match="no such GPU"):
            resolve_devices("cuda", (str(torch.cuda.device_count()),))


def test_a_group_renders_real_patches_on_cpu() -> None:
    from lipcast.pipeline.builtin import BuiltinBackend

    engines = [RenderEngine(BuiltinBackend(torch.device("cpu")), (1, 2), device="cpu") for _ in range(2)]
    group = EngineGroup(engines)
    group.add_avatar(tiny_avatar())
    group.start()
    try:
        conditioning = np.array([0.8, 0.3, 0.1], np.float32)
        from lipcast.pipeline.backend import RenderItem

        patches = [group.submit(f"s{i}", RenderItem("tiny", 0, conditioning)).result(30) for i in range(2)]
        assert patches[0].pixels.shape == patches[1].pixels.shape
        np.testing.assert_array_equal(patches[0].pixels, patches[1].pixels)  # same model on each device
        assert [e.stats.frames for e in engines] == [1, 1]
    finally:
        group.stop()
