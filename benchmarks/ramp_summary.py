"""One line per ramp step from the probe's JSON (and the GPU's utilisation samples, when there are some).

    python benchmarks/ramp_summary.py PROBE.json BACKEND SESSIONS [GPU.csv]

GPU.csv is ``nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 500``
output; only the samples inside the probe's steady window (all sessions live) count.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any


def gpu_busy(path: Path, start: float, end: float) -> tuple[float | None, float | None]:
    """Mean and peak ``utilization.gpu`` (%) of the samples taken between ``start`` and ``end``."""
    values = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        try:
            when = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            value = float(parts[1])
        except ValueError:
            continue
        if start <= when <= end:
            values.append(value)
    if not values:
        return None, None
    return round(sum(values) / len(values), 1), max(values)


def fmt(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def line(doc: dict[str, Any], backend: str, sessions: str, gpu_csv: Path | None) -> str:
    s = doc["summary"]
    cpu = s.get("server_cpu") or {}
    probe = s.get("probe_cpu") or {}
    mouth, gap, offset = s["mouth_latency_ms"], s.get("frame_gap_ms") or {}, s["abs_av_offset_ms"]
    out = [
        f"{backend} sessions={sessions} ok={s['sessions']} fps_min={s['fps_min']} fps_mean={s['fps_mean']}",
        f"gap_p99_ms={gap.get('p99')} gap_max_ms={gap.get('max')} gaps>60ms={s['frame_gaps']}",
        f"freezes={s['freezes']} late={s['late_frames']} mouth_p50={mouth.get('p50')} p95={mouth.get('p95')}",
        f"|av|_p95={offset.get('p95')} audio_min={s['audio_returned_min']}",
    ]
    if cpu:
        out.append(f"server: {fmt(cpu.get('cpu_ms_per_frame'))} ms/frame {fmt(cpu.get('cores_busy'))} cores")
        workers = [p for p in cpu.get("processes", []) if p["name"].startswith("worker-")]
        for p in cpu.get("processes", []):
            if not p["name"].startswith("worker-"):
                main = p["threads_cores_busy"].get("MainThread")
                out.append(
                    f"{p['name']}={fmt(p['cores_busy'])} cores (max {fmt(p['cores_busy_max'])},"
                    f" MainThread {fmt(main)}, {fmt(p.get('cpu_ms_per_frame'))} ms/frame)"
                )
        if workers:
            busiest = max(workers, key=lambda p: p["cores_busy"] or 0.0)
            mean = sum(p["cores_busy"] or 0.0 for p in workers) / len(workers)
            sessions_per = [p.get("sessions") for p in workers]
            out.append(
                f"workers: mean {mean:.2f} cores, busiest {busiest['name']} {fmt(busiest['cores_busy'])}"
                f" (max {fmt(busiest['cores_busy_max'])}, MainThread"
                f" {fmt(busiest['threads_cores_busy'].get('MainThread'))},"
                f" {fmt(busiest.get('cpu_ms_per_own_frame'))} ms/own frame, {busiest.get('sessions')} calls);"
                f" calls per worker {sessions_per};"
                f" expired {sum(p.get('expired', 0) for p in workers)}"
            )
        engine = cpu.get("engine") or {}
        if engine.get("frames"):
            out.append(
                f"engine: batch {engine['mean_batch']} x {engine['batch_ms_mean']} ms,"
                f" busy {fmt(100 * (engine['busy'] or 0.0), 1)} %, expired {engine['expired']}"
            )
        window = cpu.get("window") or {}
        if gpu_csv is not None and gpu_csv.exists() and window:
            mean, peak = gpu_busy(gpu_csv, window["start"], window["end"])
            out.append(f"gpu_util: mean {fmt(mean, 1)} % peak {fmt(peak, 1)} %")
    if probe:
        out.append(
            f"probe: {fmt(probe['cores_busy'])} cores over {len(probe['processes'])} procs"
            f" (busiest process-second {fmt(probe['cores_busy_max_process'])}),"
            f" {fmt(probe['cpu_ms_per_frame_received'])} ms/frame received"
        )
    return "; ".join(out)


def main(argv: list[str]) -> int:
    path, backend, sessions = Path(argv[0]), argv[1], argv[2]
    gpu_csv = Path(argv[3]) if len(argv) > 3 else None
    try:
        doc = json.loads(path.read_text())
        print(line(doc, backend, sessions, gpu_csv))
    except (OSError, ValueError, KeyError) as e:
        print(f"{backend} {sessions}: no result ({type(e).__name__}: {e})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
