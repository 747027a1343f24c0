"""One render engine per device (several GPUs in one server), behind the engine's own interface.

Each :class:`~lipcast.pipeline.engine.RenderEngine` owns one device and batches across the sessions it serves,
so a session's frames must all go to one engine: frames of the same call batch together there, and a call
never waits on a second GPU's queue. With media workers (the usual case) each worker is bound to one engine
and the front places a new call on the engine with the most headroom (:mod:`lipcast.server.front.pool`);
frames submitted here directly (``--media-workers 1``) are given an engine per session on the session's first
frame: the one serving the fewest sessions. Avatars are prepared on every engine, warm-up renders every
bucket on every engine, and the counters are summed (``per_device`` has them one by one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import fields

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import LipSyncBackend, RenderedPatch, RenderItem
from lipcast.pipeline.engine import EngineStats, RenderEngine
from lipcast.pipeline.warmup import WARMUP_TIMED_RENDERS


def summed_stats(stats: Sequence[EngineStats]) -> EngineStats:
    """The counters of several engines added up (``last_batch_ms``: the largest)."""
    total = EngineStats()
    for one in stats:
        for f in fields(EngineStats):
            if f.name == "batch_size_counts":
                counts = Counter(total.batch_size_counts)
                counts.update(one.batch_size_counts)
                total.batch_size_counts = dict(counts)
            elif f.name == "last_batch_ms":
                total.last_batch_ms = max(total.last_batch_ms, one.last_batch_ms)
            else:
                setattr(total, f.name, getattr(total, f.name) + getattr(one, f.name))
    return total


class EngineGroup:
    """Several engines, one per device, used like one (:class:`~lipcast.pipeline.engine.RenderEngine`'s
    methods)."""

    def __init__(self, engines: Sequence[RenderEngine]) -> None:
        if not engines:
            raise ValueError("an engine group needs at least one engine")
        sizes = {engine.batch_sizes for engine in engines}
        if len(sizes) != 1:
            raise ValueError(f"the engines' batch sizes differ: {sorted(sizes)}")
        self.engines = tuple(engines)
        self.batch_sizes = self.engines[0].batch_sizes
        self._session_engine: dict[str, int] = {}

    @property
    def backend(self) -> LipSyncBackend:
        """The first engine's backend (all are the same model on different devices)."""
        return self.engines[0].backend

    @property
    def devices(self) -> list[str]:
        """A label per engine: its device, with ``/index`` added where two share one (two CPU engines)."""
        names = [engine.device or "engine" for engine in self.engines]
        return [n if names.count(n) == 1 else f"{n}/{i}" for i, n in enumerate(names)]

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return all(engine.running for engine in self.engines)

    def start(self) -> None:
        for engine in self.engines:
            engine.start()

    def stop(self) -> None:
        for engine in self.engines:
            engine.stop()
        self._session_engine.clear()

    @property
    def warmup_s(self) -> float | None:
        times = [engine.warmup_s for engine in self.engines]
        return None if any(t is None for t in times) else sum(t for t in times if t is not None)

    def add_avatar(self, avatar: Avatar) -> None:
        for engine in self.engines:
            engine.add_avatar(avatar)

    def has_avatar(self, name: str) -> bool:
        return all(engine.has_avatar(name) for engine in self.engines)

    def warmup(self, repeats: int = WARMUP_TIMED_RENDERS) -> dict[int, float]:
        """Warm every engine up in turn; ms per size: the slowest engine's (the render budget must fit it)."""
        per_engine = [engine.warmup(repeats) for engine in self.engines]
        return {size: max(t[size] for t in per_engine) for size in per_engine[0]}

    # -- submission -----------------------------------------------------------------------------------------

    def engine_of(self, session_id: str) -> RenderEngine:
        """The session's engine, chosen on its first frame: the one serving the fewest sessions."""
        index = self._session_engine.get(session_id)
        if index is None:
            load = Counter(self._session_engine.values())
            index = min(range(len(self.engines)), key=lambda i: (load[i], i))
            self._session_engine[session_id] = index
        return self.engines[index]

    def submit(
        self, session_id: str, item: RenderItem, deadline_s: float | None = None
    ) -> Future[RenderedPatch]:
        return self.engine_of(session_id).submit(session_id, item, deadline_s)

    def cancel_session(self, session_id: str) -> int:
        """Drop the session's queued frames and its engine choice (it ended or was interrupted)."""
        index = self._session_engine.pop(session_id, None)
        return 0 if index is None else self.engines[index].cancel_session(session_id)

    @property
    def queue_depth(self) -> int:
        return sum(engine.queue_depth for engine in self.engines)

    @property
    def stats(self) -> EngineStats:
        return summed_stats([engine.stats for engine in self.engines])

    def per_device(self) -> list[dict[str, object]]:
        """Each engine's device, sessions given to it here, queue and counters (for /healthz)."""
        load = Counter(self._session_engine.values())
        return [
            {
                "device": device,
                "running": engine.running,
                "sessions": load[i],
                "queue_depth": engine.queue_depth,
                "frames": engine.stats.frames,
                "busy_s": round(engine.stats.busy_s, 3),
                "expired": engine.stats.expired,
            }
            for i, (device, engine) in enumerate(zip(self.devices, self.engines, strict=True))
        ]
