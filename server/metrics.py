"""Prometheus metrics (``GET /metrics``): what the server is doing, per stage, from outside.

Counters and gauges of sessions, streams and the engine are read at scrape time by the collector that
:mod:`lipcast.server.runtime_metrics` attaches once the runtime exists. Per-frame stage timings (features,
render, compositing, encode) and buffer depths are observed into histograms as frames leave. Each application
has its own registry, so several servers (tests) coexist.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.registry import Collector

from lipcast.streaming.loop_stalls import Stall
from lipcast.streaming.wire import FrameMeta

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STAGE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)
DEPTH_BUCKETS_MS = (10, 20, 40, 60, 80, 120, 160, 240, 320, 500, 1000)
STALL_BUCKETS_S = (0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


class Metrics:
    """One app's registry: histograms fed by sessions, and the collectors attached to it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.stage_seconds = Histogram(
            "lipcast_stage_seconds",
            "Time per video frame in each pipeline stage",
            ["stage"],
            buckets=STAGE_BUCKETS_S,
            registry=self.registry,
        )
        self.buffer_depth_ms = Histogram(
            "lipcast_input_buffer_depth_ms",
            "Inbound audio buffered (jitter buffer depth) when a frame left, in milliseconds",
            buckets=DEPTH_BUCKETS_MS,
            registry=self.registry,
        )
        self.loop_stall_seconds = Histogram(
            "lipcast_event_loop_stall_seconds",
            "Event-loop stalls longer than --loop-stall-ms (no callback ran), by length",
            buckets=STALL_BUCKETS_S,
            registry=self.registry,
        )

    def attach(self, collector: Collector) -> None:
        """Read ``collector`` at every scrape too (the runtime's counters:
        :mod:`lipcast.server.runtime_metrics`)."""
        self.registry.register(collector)

    def observe_frame(self, meta: FrameMeta, buffer_depth_ms: float) -> None:
        """Called for every video frame that leaves (from the session's on-frame hook)."""
        for stage, ms in meta.stages_ms.items():
            self.stage_seconds.labels(stage).observe(ms / 1000.0)
        self.buffer_depth_ms.observe(buffer_depth_ms)

    def observe_stall(self, stall: Stall) -> None:
        self.loop_stall_seconds.observe(stall.duration_ms / 1000.0)

    def observe_encode(self, kind: str, seconds: float) -> None:
        self.stage_seconds.labels(f"encode_{kind}").observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
