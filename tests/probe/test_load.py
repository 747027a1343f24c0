"""The probe's load figures from polled /healthz answers: steady window, per process, engine, clients."""

from __future__ import annotations

from typing import Any

from lipcast.probe.load import clients_load, format_load, process_load, server_load, steady_window


def snapshot(pid: int, cpu_s: float, at_s: float, main_s: float) -> dict[str, Any]:
    return {"pid": pid, "process_cpu_s": cpu_s, "monotonic_s": at_s, "threads_cpu_s": {"MainThread": main_s}}


def health(t: float, sessions: int, frames: int, worker_pid: int = 200) -> dict[str, Any]:
    """A front with two workers, all busy in proportion to ``t``; worker 1 at twice worker 0's rate."""
    return {
        "sessions": sessions,
        "frames_sent_total": frames,
        "process_cpu_s": 3.5 * t,
        "cpu": snapshot(100, 0.5 * t, t, 0.1 * t),
        "engine": {"stats": {"batches": 10 * t, "frames": 20 * t, "busy_s": 0.25 * t, "expired": 0}},
        "media_workers": {
            "workers": [
                {"index": 0, "sessions": sessions // 2, "frames_sent_total": frames // 3,
                 "cpu": snapshot(worker_pid, 1.0 * t, t, 0.5 * t), "link": {"expired": int(t)}},
                {"index": 1, "sessions": sessions - sessions // 2, "frames_sent_total": 2 * frames // 3,
                 "cpu": snapshot(300, 2.0 * t, t, 0.9 * t), "link": {"expired": 0}},
            ]
        },
    }  # fmt: skip


def test_steady_window_is_where_the_most_sessions_were() -> None:
    samples = [(float(t), {"sessions": n}) for t, n in enumerate([0, 2, 4, 4, 4, 3, 0])]
    assert steady_window(samples) == (2, 4)
    assert steady_window([(0.0, {"sessions": 1}), (1.0, {"sessions": 0})]) == (0, 1)  # one poll: all


def test_server_load_per_process_over_the_steady_window() -> None:
    sessions = [1, 4, 4, 4, 4, 2]
    samples = [(1000.0 + t, health(float(t), n, 100 * t)) for t, n in enumerate(sessions)]
    load = server_load(samples)
    assert load["window"]["wall_s"] == 3.0 and load["window"]["sessions"] == 4  # polls 1..4
    assert load["frames"] == 300 and load["cores_busy"] == 3.5
    assert load["cpu_ms_per_frame"] == round(1000 * 3.5 * 3 / 300, 3)
    by_name = {p["name"]: p for p in load["processes"]}
    assert set(by_name) == {"front", "worker-0", "worker-1"}
    assert by_name["front"]["cores_busy"] == 0.5
    assert by_name["worker-1"]["cores_busy"] == 2.0 and by_name["worker-1"]["sessions"] == 2
    assert by_name["worker-1"]["threads_cores_busy"]["MainThread"] == 0.9
    assert by_name["worker-0"]["frames"] == 100 and by_name["worker-0"]["expired"] == 3
    assert by_name["worker-0"]["cpu_ms_per_own_frame"] == 30.0
    engine = load["engine"]
    assert engine["mean_batch"] == 2.0 and engine["batch_ms_mean"] == 25.0 and engine["busy"] == 0.25
    text = "\n".join(format_load(load, {}))
    assert "worker-1" in text and "MainThread 0.90" in text and "mean batch 2.0" in text


def test_a_replaced_worker_counts_from_its_new_process() -> None:
    samples = [(float(t), health(float(t), 4, 100 * t, worker_pid=200 if t < 2 else 201)) for t in range(5)]
    load = server_load(samples)
    worker = next(p for p in load["processes"] if p["name"] == "worker-0")
    assert worker["pid"] == 201 and worker["wall_s"] == 2.0  # polls 2..4 only


def test_peaks_ignore_short_intervals() -> None:
    snaps = [snapshot(1, 0.0, 0.0, 0.0), snapshot(1, 0.5, 1.0, 0.5), snapshot(1, 0.51, 1.01, 0.51)]
    load = process_load(snaps)
    assert load["cores_busy_max"] == 0.5  # not 1.0 from the last 10 ms
    assert load["threads_cores_busy_max"]["MainThread"] == 0.5


def test_clients_load_sums_the_processes() -> None:
    parts = [process_load([snapshot(k, 0.0, 0.0, 0.0), snapshot(k, 1.0, 2.0, 0.8)]) for k in (1, 2)]
    load = clients_load([*parts, {}], frames_received=400)
    assert load["cores_busy"] == 1.0 and load["cpu_ms_per_frame_received"] == 5.0
    assert len(load["processes"]) == 2
    assert "probe clients: 2 process(es)" in "\n".join(format_load({}, load))


def test_the_clients_own_loop_stalls_are_counted_and_the_longest_named() -> None:
    parts = [process_load([snapshot(k, 0.0, 0.0, 0.0), snapshot(k, 1.0, 2.0, 0.8)]) for k in (1, 2)]
    parts[0]["loop_stalls_ms"] = [35.0, 92.4]
    parts[1]["loop_stalls_ms"] = [41.0]
    load = clients_load(parts, frames_received=400)
    assert load["loop_stalls"] == 3 and load["loop_stall_max_ms"] == 92.4
    assert "event-loop stalls >= 30 ms: 3 (longest 92 ms)" in "\n".join(format_load({}, load))
    quiet = clients_load([{**parts[1], "loop_stalls_ms": []}], frames_received=400)
    assert quiet["loop_stalls"] == 0 and quiet["loop_stall_max_ms"] is None
    assert format_load({}, quiet)[0].endswith("event-loop stalls >= 30 ms: 0")
