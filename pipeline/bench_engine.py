"""Simulated sessions against the render engine: how many 25 fps sessions it keeps fully on time.

Each simulated session submits one frame every 40 ms (sessions evenly staggered over the frame period),
with the deadline a live session would give it (submission + render budget). A frame is on time when its
future resolves with a patch before that deadline. Conditioning is precomputed (random Wav2Lip mel windows
or built-in mouth parameters): this measures the engine and its device, not the per-session CPU features,
which are timed separately (``featurizer_us_per_hop``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import LipSyncBackend, RenderedPatch, RenderItem
from lipcast.pipeline.defaults import RENDER_BUDGET_MS
from lipcast.pipeline.engine import RenderEngine
from lipcast.pipeline.timing import FEATURE_SAMPLES_PER_FRAME, FPS


@dataclass
class LoadResult:
    sessions: int
    frames: int
    on_time: int
    expired: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_batch: float
    gpu_memory_mb: float | None

    @property
    def on_time_share(self) -> float:
        return self.on_time / self.frames if self.frames else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "on_time_share": round(self.on_time_share, 5)}


def featurizer_us_per_hop(backend: LipSyncBackend, hops: int = 500) -> float:
    featurizer = backend.new_featurizer()
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal((hops, FEATURE_SAMPLES_PER_FRAME))).astype(np.float32)
    start = time.perf_counter()
    for hop in audio:
        featurizer.push(hop)
    return (time.perf_counter() - start) * 1e6 / hops


def run_load(
    engine: RenderEngine,
    avatar: Avatar,
    sessions: int,
    *,
    seconds: float = 4.0,
    fps: int = FPS,
    budget_ms: float = RENDER_BUDGET_MS,
    seed: int = 0,
    enhance_strength: float = 0.0,
) -> LoadResult:
    """Drive ``sessions`` simulated sessions for ``seconds``; the engine must be started.
    ``enhance_strength``: every session's face post-processing weight (0: off; > 0: sharpen)."""
    rng = np.random.default_rng(seed)
    shape = engine.backend.conditioning_shape
    pool = rng.uniform(-4.0, 1.0, (64, *shape)).astype(np.float32)
    period_s = 1.0 / fps
    budget_s = budget_ms / 1000.0
    latencies: list[float] = []
    outcomes = {"on_time": 0, "expired": 0, "frames": 0}
    lock = threading.Lock()
    batches_before = engine.stats.batches
    frames_before = engine.stats.frames
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.monotonic() + 0.05
    schedule = [
        (start + k * period_s + s * period_s / sessions, s)
        for k in range(int(seconds * fps))
        for s in range(sessions)
    ]

    def done(future: Future[RenderedPatch], *, submitted: float, deadline: float) -> None:
        now = time.monotonic()
        with lock:
            outcomes["frames"] += 1
            if not future.cancelled() and future.exception() is None and now <= deadline:
                outcomes["on_time"] += 1
                latencies.append((now - submitted) * 1000.0)
            elif future.exception() is not None:
                outcomes["expired"] += 1

    futures = []
    for i, (due, session) in enumerate(schedule):
        delay = due - time.monotonic()
        if delay > 0.0005:
            time.sleep(delay)
        submitted = time.monotonic()
        deadline = submitted + budget_s
        item = RenderItem(avatar.name, i % avatar.frame_count, pool[i % len(pool)], enhance_strength)
        future = engine.submit(f"sim-{session}", item, deadline_s=deadline)
        future.add_done_callback(partial(done, submitted=submitted, deadline=deadline))
        futures.append(future)
    for future in futures:
        try:
            future.result(timeout=10)
        except Exception:  # expired frames are counted by the callback
            pass
    lat = np.asarray(latencies) if latencies else np.zeros(1)
    batches = engine.stats.batches - batches_before
    memory = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return LoadResult(
        sessions=sessions,
        frames=len(futures),
        on_time=outcomes["on_time"],
        expired=outcomes["expired"],
        p50_ms=round(float(np.percentile(lat, 50)), 3),
        p99_ms=round(float(np.percentile(lat, 99)), 3),
        max_ms=round(float(lat.max()), 3),
        mean_batch=round((engine.stats.frames - frames_before) / max(1, batches), 2),
        gpu_memory_mb=round(memory, 1) if memory is not None else None,
    )


def find_capacity(
    engine: RenderEngine,
    avatar: Avatar,
    start: int = 1,
    limit: int = 4096,
    seconds: float = 4.0,
    budget_ms: float = RENDER_BUDGET_MS,
    enhance_strength: float = 0.0,
) -> tuple[int, list[LoadResult]]:
    """Double the session count until a frame is late, then bisect: the most with every frame on time."""
    results: list[LoadResult] = []
    good, bad = 0, None
    n = start
    while n <= limit:
        result = run_load(
            engine, avatar, n, seconds=seconds, budget_ms=budget_ms, enhance_strength=enhance_strength
        )
        results.append(result)
        if result.on_time == result.frames:
            good = n
            n *= 2
        else:
            bad = n
            break
    while bad is not None and bad - good > max(1, good // 16):
        mid = (good + bad) // 2
        result = run_load(
            engine, avatar, mid, seconds=seconds, budget_ms=budget_ms, enhance_strength=enhance_strength
        )
        results.append(result)
        if result.on_time == result.frames:
            good = mid
        else:
            bad = mid
    return good, results
