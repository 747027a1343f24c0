"""CPU time of this process and of its threads, for the load figures in ``/healthz`` and the probe's report.

Thread CPU comes from Linux's ``/proc/self/task/<tid>/stat`` (no dependency; nothing elsewhere). Python
threads are named by their Python names with the running number dropped (``ThreadPoolExecutor-0_3`` ->
``ThreadPoolExecutor``), so a pool of threads counts as one line; threads that Python did not start (libvpx,
torch, OpenMP) go under ``native``. The event loop's thread is ``MainThread``: one thread near a whole core
is a saturated event loop (or GIL holder) whatever the process total says.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
_NUMBER = re.compile(r"[-_ ]w?\d+(\.\d+)?$")  # "-0_3", "_0", "-w3": a pool's or a link's running number
_AUTO = re.compile(r"^Thread-\d+ \((.+)\)$")  # Python's name for an unnamed thread: its target's name


def thread_group(name: str) -> str:
    """The name a thread's CPU is counted under: its Python name without running numbers."""
    auto = _AUTO.match(name)
    if auto:
        name = auto.group(1)
    while True:
        shorter = _NUMBER.sub("", name)
        if shorter == name or not shorter:
            return name
        name = shorter


def _task_cpu_s(tid: int) -> float | None:
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # the thread ended meanwhile, or no /proc
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14, 15)


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each group of this process's live threads; ``{}`` where ``/proc`` has no tasks."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return {}
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out: dict[str, float] = {}
    for tid in tids:
        cpu_s = _task_cpu_s(tid)
        if cpu_s is None:
            continue
        group = thread_group(names[tid]) if tid in names else "native"
        out[group] = round(out.get(group, 0.0) + cpu_s, 3)
    return out


def cpu_snapshot() -> dict[str, Any]:
    """What ``/healthz`` reports: this process's CPU seconds, per thread group too, and when."""
    return {
        "pid": os.getpid(),
        "process_cpu_s": round(time.process_time(), 3),
        "threads_cpu_s": thread_cpu_s(),
        "monotonic_s": round(time.monotonic(), 3),
    }


def cpu_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """CPU used between two :func:`cpu_snapshot` s (of the same process): seconds, cores, per thread group.

    A thread group that appeared meanwhile counts from zero; one that vanished (its threads ended) is left
    out, so the groups may sum to less than the process (ended threads' time is the difference).
    """
    wall_s = float(after["monotonic_s"]) - float(before["monotonic_s"])
    cpu_s = float(after["process_cpu_s"]) - float(before["process_cpu_s"])
    old = before.get("threads_cpu_s") or {}
    threads = {
        name: round(float(value) - float(old.get(name, 0.0)), 3)
        for name, value in (after.get("threads_cpu_s") or {}).items()
    }
    return {
        "cpu_s": round(cpu_s, 3),
        "wall_s": round(wall_s, 3),
        "cores_busy": round(cpu_s / wall_s, 3) if wall_s > 0 else None,
        "threads_cores_busy": {
            name: round(value / wall_s, 3) for name, value in sorted(threads.items(), key=lambda kv: -kv[1])
        }
        if wall_s > 0
        else {},
    }
