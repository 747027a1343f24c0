"""Where the CPU goes during a load run: the server's processes (from ``/healthz``) and the probe's own.

While the calls run, the probe polls the server's ``/healthz`` once a second. Each answer carries a CPU
snapshot of the front (with its engine) and of every media worker, per thread group too
(:mod:`lipcast.streaming.cpu_usage`), and the engine's counters. The figures are taken over the **steady
window**: from the first poll that saw the most sessions to the last one that still did, so the ramp up and
the calls ending do not dilute them. Per process: cores busy (mean, and the busiest second), CPU per frame,
the busiest thread groups. Each probe client process samples itself the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from lipcast.streaming.cpu_usage import cpu_delta, cpu_snapshot

POLL_INTERVAL_S = 1.0
MIN_PEAK_INTERVAL_S = 0.5
TOP_THREADS = 4  # thread groups listed per process
PROBE_LOOP_STALL_MS = 30.0  # a client process's own stalls this long are counted (they delay what it sends)


@dataclass
class HealthPoller:
    """Polls ``{url}/healthz`` every ``interval_s`` until stopped; keeps (probe wall time, body)."""

    http: aiohttp.ClientSession
    url: str
    interval_s: float = POLL_INTERVAL_S
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def poll_once(self) -> None:
        try:
            timeout = aiohttp.ClientTimeout(total=max(2.0, self.interval_s))
            async with self.http.get(f"{self.url}/healthz", timeout=timeout) as response:
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        if isinstance(body, dict):
            self.samples.append((time.time(), body))

    async def _run(self) -> None:
        start = time.monotonic()
        ticks = 0
        while True:
            await self.poll_once()
            ticks += 1
            await asyncio.sleep(max(0.0, start + ticks * self.interval_s - time.monotonic()))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="probe-health-poller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.poll_once()  # the closing figures


class SelfSampler:
    """This process's CPU snapshot every ``interval_s`` (a probe client process measuring itself)."""

    def __init__(self, interval_s: float = POLL_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.snapshots: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.snapshots.append(cpu_snapshot())
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="probe-cpu-sampler")

    async def stop(self) -> dict[str, Any]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.snapshots.append(cpu_snapshot())
        return process_load(self.snapshots)


def process_load(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean cores busy over ``snapshots`` (of one process), the busiest interval, the top thread groups."""
    if len(snapshots) < 2:
        return {}
    whole = cpu_delta(snapshots[0], snapshots[-1])
    steps = [cpu_delta(a, b) for a, b in zip(snapshots, snapshots[1:], strict=False)]
    # Thread CPU counts in clock ticks (10 ms): over a short interval (the closing snapshot just after a
    # regular one) one tick would read as a busy core, so peaks come from the full intervals only.
    steps = [s for s in steps if s["wall_s"] >= MIN_PEAK_INTERVAL_S] or [whole]
    peaks = [s["cores_busy"] for s in steps if s["cores_busy"] is not None]
    thread_peaks: dict[str, float] = {}
    for step in steps:
        for name, cores in step["threads_cores_busy"].items():
            thread_peaks[name] = max(thread_peaks.get(name, 0.0), cores)
    top = list(whole["threads_cores_busy"].items())[:TOP_THREADS]
    return {
        "pid": snapshots[-1].get("pid"),
        "cpu_s": whole["cpu_s"],
        "wall_s": whole["wall_s"],
        "cores_busy": whole["cores_busy"],
        "cores_busy_max": max(peaks, default=None),  # the busiest interval (~1 s)
        "threads_cores_busy": dict(top),
        "threads_cores_busy_max": {name: thread_peaks.get(name, 0.0) for name, _ in top},
    }


def _processes(body: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """name -> (cpu snapshot, the process's own counters) of every server process in one answer."""
    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    workers = (body.get("media_workers") or {}).get("workers") or []
    if isinstance(body.get("cpu"), dict):
        out["front" if workers else "server"] = (body["cpu"], {"frames": body.get("frames_sent_total")})
    for w in workers:
        if isinstance(w.get("cpu"), dict):
            counters = {
                "frames": w.get("frames_sent_total"),
                "sessions": w.get("sessions"),
                **(w.get("link") or {}),
            }
            out[f"worker-{w.get('index')}"] = (w["cpu"], counters)
    return out


def steady_window(samples: list[tuple[float, dict[str, Any]]]) -> tuple[int, int]:
    """Indices of the first and last sample at the most sessions seen (the whole run if that is one poll)."""
    counts = [int(body.get("sessions") or 0) for _, body in samples]
    peak = max(counts)
    first = counts.index(peak)
    last = len(counts) - 1 - counts[::-1].index(peak)
    return (first, last) if last > first else (0, len(samples) - 1)


def _delta(after: dict[str, Any], before: dict[str, Any], key: str) -> float:
    try:
        return float(after[key]) - float(before[key])
    except (KeyError, TypeError, ValueError):
        return 0.0


def server_load(samples: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """The server's figures over the steady window of ``samples`` (:class:`HealthPoller`)."""
    usable = [(t, b) for t, b in samples if "process_cpu_s" in b]
    if len(usable) < 2:
        return {}
    i, j = steady_window(usable)
    (t0, first), (t1, last) = usable[i], usable[j]
    wall_s = t1 - t0
    cpu_s = _delta(last, first, "process_cpu_s")
    frames = int(_delta(last, first, "frames_sent_total"))
    out: dict[str, Any] = {
        "window": {"start": t0, "end": t1, "wall_s": round(wall_s, 3), "sessions": last.get("sessions")},
        "cpu_s": round(cpu_s, 3),
        "frames": frames,
        "cpu_ms_per_frame": round(1000.0 * cpu_s / frames, 3) if frames else None,
        "cores_busy": round(cpu_s / wall_s, 3) if wall_s > 0 else None,
    }
    series: dict[str, list[dict[str, Any]]] = {}
    counters: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for _, body in usable[i : j + 1]:
        for name, (snapshot, own) in _processes(body).items():
            runs = series.setdefault(name, [])
            if runs and runs[-1].get("pid") != snapshot.get("pid"):
                runs.clear()  # a replaced worker: count the new process from here
                counters.pop(name, None)
            if not runs or snapshot.get("monotonic_s") != runs[-1].get("monotonic_s"):
                runs.append(snapshot)
            counters.setdefault(name, (own, own))
            counters[name] = (counters[name][0], own)
    processes = []
    for name, snapshots in series.items():
        figures = process_load(snapshots)
        if not figures:
            continue
        own_first, own_last = counters[name]
        own_frames = int(_delta(own_last, own_first, "frames"))
        figures = {"name": name, **figures}
        figures["cpu_ms_per_frame"] = round(1000.0 * figures["cpu_s"] / frames, 3) if frames else None
        if name.startswith("worker-"):
            figures["sessions"] = own_last.get("sessions")
            figures["frames"] = own_frames
            figures["cpu_ms_per_own_frame"] = (
                round(1000.0 * figures["cpu_s"] / own_frames, 3) if own_frames else None
            )
            for key in ("expired", "ring_full", "failed"):
                if key in own_last:
                    figures[key] = int(_delta(own_last, own_first, key))
        processes.append(figures)
    out["processes"] = processes
    engine = _engine(first, last, wall_s)
    if engine:
        out["engine"] = engine
    return out


def _engine(first: dict[str, Any], last: dict[str, Any], wall_s: float) -> dict[str, Any]:
    before = (first.get("engine") or {}).get("stats") or {}
    after = (last.get("engine") or {}).get("stats") or {}
    if not after:
        return {}
    batches = _delta(after, before, "batches")
    frames = _delta(after, before, "frames")
    busy_s = _delta(after, before, "busy_s")
    return {
        "frames": int(frames),
        "frames_per_s": round(frames / wall_s, 1) if wall_s > 0 else None,
        "mean_batch": round(frames / batches, 2) if batches else None,
        "batch_ms_mean": round(1000.0 * busy_s / batches, 3) if batches else None,
        "busy": round(busy_s / wall_s, 4) if wall_s > 0 else None,  # share of wall time inside render()
        "expired": int(_delta(after, before, "expired")),
        "padded_frames": int(_delta(after, before, "padded_frames")),
    }


def clients_load(parts: list[dict[str, Any]], frames_received: int) -> dict[str, Any]:
    """The probe's client processes together: each one's figures, their sum, CPU per frame received."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    cpu_s = sum(float(p["cpu_s"]) for p in parts)
    stalls_ms = [float(ms) for p in parts for ms in p.get("loop_stalls_ms", [])]
    return {
        "processes": parts,
        "loop_stalls": len(stalls_ms),  # of PROBE_LOOP_STALL_MS or more, all client processes
        "loop_stall_max_ms": max(stalls_ms, default=None),
        "cpu_s": round(cpu_s, 3),
        "cores_busy": round(sum(float(p["cores_busy"] or 0.0) for p in parts), 3),
        "cores_busy_max_process": max(float(p["cores_busy_max"] or 0.0) for p in parts),
        "cpu_ms_per_frame_received": round(1000.0 * cpu_s / frames_received, 3) if frames_received else None,
    }


def _threads(figures: dict[str, Any]) -> str:
    return ", ".join(f"{name} {cores:.2f}" for name, cores in figures.get("threads_cores_busy", {}).items())


def format_load(server: dict[str, Any], clients: dict[str, Any]) -> list[str]:
    """The summary's lines about CPU: the server's total, each of its processes, the engine, the probe."""
    lines = []
    if server:
        window = server["window"]
        per_frame = server["cpu_ms_per_frame"]
        lines.append(
            f"  server CPU over {window['wall_s']:.1f} s at {window['sessions']} session(s):"
            f" {per_frame if per_frame is None else f'{per_frame:.2f}'} ms per frame sent;"
            f" {server['cores_busy']:.2f} cores busy"
        )
        for p in server.get("processes", []):
            own = p.get("cpu_ms_per_own_frame")
            extra = (
                f", {p.get('sessions')} call(s), {own:.2f} ms per own frame, expired {p.get('expired', 0)}"
                if own is not None
                else ""
            )
            lines.append(
                f"    {p['name']:<10} {p['cores_busy']:.2f} cores"
                f" (busiest second {p['cores_busy_max'] or 0:.2f}){extra}; threads: {_threads(p)}"
            )
        engine = server.get("engine")
        if engine and engine["frames"]:
            lines.append(
                f"  engine: {engine['frames_per_s']} frames/s, mean batch {engine['mean_batch']},"
                f" {engine['batch_ms_mean']} ms per batch, busy {100 * (engine['busy'] or 0):.1f} %,"
                f" expired {engine['expired']}"
            )
    if clients:
        per_frame = clients["cpu_ms_per_frame_received"]
        lines.append(
            f"  probe clients: {len(clients['processes'])} process(es),"
            f" {clients['cores_busy']:.2f} cores busy"
            f" (busiest process-second {clients['cores_busy_max_process']:.2f}),"
            f" {per_frame if per_frame is None else f'{per_frame:.2f}'} ms per frame received;"
            f" event-loop stalls >= {PROBE_LOOP_STALL_MS:.0f} ms: {clients.get('loop_stalls', 0)}"
            + (f" (longest {longest:.0f} ms)" if (longest := clients.get("loop_stall_max_ms")) else "")
        )
        for k, p in enumerate(clients["processes"]):
            lines.append(f"    client-{k:<3} {p['cores_busy']:.2f} cores; threads: {_threads(p)}")
    return lines
