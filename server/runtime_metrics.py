"""The runtime's side of ``GET /metrics``: sessions, streams and the engine, read at scrape time from the
objects that already keep them (live sessions plus the totals of ended ones), so the media path carries no
metrics code. Registered on the app's :class:`~lipcast.server.metrics.Metrics` once the runtime is built."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lipcast.pipeline.engine_group import EngineGroup
from lipcast.server.state import Runtime


class RuntimeCollector(Collector):
    """The runtime's counters and gauges, read at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        runtime = self.runtime
        sessions = runtime.sessions
        totals = sessions.totals()
        yield _gauge("lipcast_sessions_active", "Live sessions", len(sessions.sessions))
        yield _gauge("lipcast_sessions_max", "Session limit", runtime.settings.max_sessions)
        yield _gauge("lipcast_ready", "1 when the server takes new sessions", 1 if runtime.is_ready() else 0)
        yield _gauge("lipcast_draining", "1 while shutting down gracefully", 1 if runtime.draining else 0)
        yield _counter("lipcast_sessions_created", "Sessions created", sessions.created_total)
        refused = CounterMetricFamily(
            "lipcast_sessions_refused", "Offers refused, by reason", labels=["reason"]
        )
        for reason, count in sorted(sessions.refused_total.items()):
            refused.add_metric([reason], count)
        yield refused
        described = {
            "frames_in": "Inbound audio frames received from callers",
            "frames_out": "Video frames sent",
            "frames_rendered": "Frames rendered by the lip-sync backend",
            "frames_at_rest": "Frames sent as the avatar at rest (no rendering)",
            "frames_late": "Frames whose render was not ready in time (the previous frame was repeated)",
            "frames_skipped": "Frames not sent because the sender fell behind",
            "frames_failed": "Frames whose render failed (the avatar frame was sent as it is)",
            "audio_underruns": "Ticks that found the inbound audio buffer dry (silence was sent)",
            "audio_trimmed_samples": "Inbound 48 kHz samples of silence removed to bring latency back down",
            "audio_overflow_samples": "Inbound 48 kHz samples dropped above the buffer's hard bound",
            "audio_packets_lost": "Inbound audio packets given up on and concealed",
            "audio_concealed_samples": "Inbound 48 kHz samples made up for lost packets (FEC or PLC)",
            "audio_fec_recovered": "Lost inbound audio packets rebuilt from the next packet's in-band FEC",
            "audio_fec_missed": "Lost inbound audio packets concealed before their FEC came (PLC)",
            "audio_packets_late": "Inbound audio packets dropped: arrived after their slot was concealed",
            "audio_packets_reordered": "Inbound audio packets that arrived after a later one, in time",
            "audio_stretched_samples": "Inbound samples concealed to hold the stream back (late audio)",
            "push_bytes_in": "PCM16 bytes queued by push sessions",
            "push_bytes_refused": "PCM16 bytes refused by push sessions (buffer full; the sender was told)",
            "interrupts": "Interrupts (barge-in) of push sessions",
        }
        for name, help_text in described.items():
            yield _counter(f"lipcast_{name}", help_text, totals.get(name, 0))
        depths = [s.buffer.depth_ms for s in sessions.sessions.values()]
        yield _gauge(
            "lipcast_input_buffer_depth_max_ms", "Deepest inbound audio buffer now", max(depths, default=0)
        )
        targets = [s.buffer.target_ms for s in sessions.sessions.values()]
        yield _gauge(
            "lipcast_input_buffer_target_max_ms",
            "Highest inbound audio buffer target now (follows the network's jitter)",
            max(targets, default=0),
        )
        engine = runtime.engine.stats
        yield _counter("lipcast_engine_batches", "Batches rendered", engine.batches)
        yield _counter("lipcast_engine_frames", "Frames rendered by the engine", engine.frames)
        yield _counter(
            "lipcast_engine_padded_frames", "Padding frames in fixed-size batches", engine.padded_frames
        )
        yield _counter("lipcast_engine_expired", "Frames dropped at their deadline", engine.expired)
        yield _counter("lipcast_engine_failed_batches", "Batches that raised", engine.failed_batches)
        yield _counter("lipcast_engine_busy_seconds", "Time the engine spent rendering", engine.busy_s)
        sizes = CounterMetricFamily("lipcast_engine_batch_size", "Batches by size", labels=["size"])
        for size, count in sorted(engine.batch_size_counts.items()):
            sizes.add_metric([str(size)], count)
        yield sizes
        yield _gauge(
            "lipcast_engine_queue_depth", "Frames waiting for the engine", runtime.engine.queue_depth
        )
        if isinstance(runtime.engine, EngineGroup):  # one engine per GPU: each one's share
            yield from _per_device(runtime.engine)
        memory = runtime.gpu_memory_bytes()
        if memory is not None:
            yield _gauge("lipcast_gpu_memory_bytes", "GPU memory allocated by the engine", memory)
        yield _gauge("lipcast_uptime_seconds", "Seconds since start", time.monotonic() - runtime.started_s)


def _per_device(group: EngineGroup) -> Iterator[Metric]:
    families = {
        "frames": CounterMetricFamily(
            "lipcast_device_engine_frames", "Frames rendered, per device", labels=["device"]
        ),
        "busy_s": CounterMetricFamily(
            "lipcast_device_engine_busy_seconds", "Time spent rendering, per device", labels=["device"]
        ),
        "expired": CounterMetricFamily(
            "lipcast_device_engine_expired", "Frames dropped at their deadline, per device", labels=["device"]
        ),
    }
    queue = GaugeMetricFamily(
        "lipcast_device_engine_queue_depth", "Frames waiting, per device", labels=["device"]
    )
    for device, engine in zip(group.devices, group.engines, strict=True):
        for field_name, family in families.items():
            family.add_metric([device], getattr(engine.stats, field_name))
        queue.add_metric([device], engine.queue_depth)
    yield from families.values()
    yield queue


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)
