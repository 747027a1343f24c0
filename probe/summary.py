"""The probe's figures over all of its calls: the summary it prints and writes, the per-stage breakdown,
and the check against the thresholds given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lipcast.probe import analysis
from lipcast.probe.load import format_load
from lipcast.probe.report import CallReport, percentiles


@dataclass(frozen=True)
class Thresholds:
    max_mouth_latency_p95_ms: float | None = None
    max_av_offset_p95_ms: float | None = None
    min_fps: float | None = None
    min_audio_returned: float | None = None


def late_knee(reports: list[CallReport]) -> dict[str, Any]:
    """Per second of the run: sessions receiving frames and the share of gaps; where lateness starts."""
    arrivals = [np.asarray(r.frame_arrivals) for r in reports if len(r.frame_arrivals) > 1]
    if not arrivals:
        return {}
    t0 = min(a[0] for a in arrivals)
    t1 = max(a[-1] for a in arrivals)
    seconds = []
    for s in range(int(t1 - t0)):
        lo, hi = t0 + s, t0 + s + 1
        active = late = frames = 0
        for a in arrivals:
            inside = a[(a >= lo) & (a < hi)]
            if a[0] <= lo and a[-1] >= hi:
                active += 1
            frames += len(inside)
            late += int((np.diff(inside) > 0.060).sum())
        seconds.append({"second": s, "active_sessions": active, "frames": frames, "gaps": late})
    knee = next(
        (x["active_sessions"] for x in seconds if x["frames"] and x["gaps"] / x["frames"] > 0.01), None
    )
    return {"per_second": seconds, "late_from_sessions": knee}


def _frame_gaps(reports: list[CallReport]) -> dict[str, float]:
    """Percentiles (and the largest) of the time between consecutive frames, over every session."""
    gaps = [analysis.frame_gaps_ms(r.frame_arrivals) for r in reports if len(r.frame_arrivals) > 1]
    if not gaps:
        return {}
    every = np.concatenate(gaps)
    return {**percentiles(every), "max": round(float(every.max()), 2)}


def summary(reports: list[CallReport], knee: dict[str, Any]) -> dict[str, Any]:
    bursts = [b for r in reports for b in r.bursts]
    frame_pairs = [
        (b.onset_frame, b.meta_onset_frame)
        for b in bursts
        if b.onset_frame is not None and b.meta_onset_frame is not None
    ]
    return {
        "sessions": len(reports),
        "mouth_latency_ms": percentiles(
            [b.mouth_latency_ms for b in bursts if b.mouth_latency_ms is not None]
        ),
        "av_offset_ms": percentiles([b.av_offset_ms for b in bursts if b.av_offset_ms is not None]),
        "abs_av_offset_ms": percentiles([abs(b.av_offset_ms) for b in bursts if b.av_offset_ms is not None]),
        "frame_latency_ms": percentiles([v for r in reports for v in r.frame_latency_ms]),
        "audio_delay_ms": percentiles([v for r in reports for v in r.audio_delay_ms]),
        "frame_gap_ms": _frame_gaps(reports),
        "fps_min": min((r.fps for r in reports), default=0.0),
        "fps_mean": round(float(np.mean([r.fps for r in reports])), 2) if reports else 0.0,
        "frame_gaps": sum(r.frame_gaps for r in reports),
        "freezes": sum(r.freezes for r in reports),
        "late_frames": sum(r.late_frames for r in reports),
        "audio_returned_min": min((r.audio_returned for r in reports), default=0.0),
        "delay_recovery": [r.delay_recovery for r in reports if r.delay_recovery is not None],
        "downlink_rate": [r.downlink_rate for r in reports if r.downlink_rate is not None],
        "mouth_correlation_min": min(
            (r.mouth_correlation for r in reports if r.mouth_correlation is not None), default=None
        ),
        "audio_gaps": sum(r.audio_gaps for r in reports),
        "bursts": len(bursts),
        "bursts_detected": sum(1 for b in bursts if b.mouth_latency_ms is not None),
        "metadata_agreement_within_1_frame": sum(1 for a, b in frame_pairs if abs(a - b) <= 1),
        "metadata_compared": len(frame_pairs),
        "late_from_sessions": knee.get("late_from_sessions"),
        "stages_ms": stage_breakdown(reports),
        "network": network_totals(reports),
        "server_rx": server_rx_totals(reports),
        "picture_recoveries_ms": sorted(v for r in reports for v in r.picture_recoveries_ms),
        "lost_keyframe_mended_ms": [r.lost_keyframe_mended_ms for r in reports if r.lost_keyframe_mended_ms],
    }


def server_rx_totals(reports: list[CallReport]) -> dict[str, float]:
    """The server's inbound audio counters summed over the sessions (its buffer target: the largest)."""
    out: dict[str, float] = {}
    for report in reports:
        for key, value in report.server_rx.items():
            out[key] = max(out.get(key, 0.0), value) if key == "target_ms" else out.get(key, 0) + value
    return out


def network_totals(reports: list[CallReport]) -> dict[str, dict[str, float]]:
    """What the probe's impairment did, per direction, summed over the sessions (empty: not impaired)."""
    out: dict[str, dict[str, float]] = {}
    for report in reports:
        for direction, stats in report.network.items():
            total = out.setdefault(direction, {})
            for key, value in stats.items():
                total[key] = (
                    max(total.get(key, 0.0), value) if key.startswith("max_") else total.get(key, 0) + value
                )
    return out


def stage_breakdown(reports: list[CallReport]) -> dict[str, dict[str, float]]:
    """Mean and percentiles of every stage of the frames' audio->frame latency, over all sessions."""
    names = ("buffer", "lookahead", "produce_late", "budget", "render", "compose", "outside")
    out = {}
    for name in names:
        values = [v for r in reports for v in r.stages_ms.get(name, [])]
        if values:
            out[name] = {"mean": round(float(np.mean(values)), 2), **percentiles(values)}
    return out


def format_stages(stages: dict[str, dict[str, float]]) -> list[str]:
    if not stages:
        return []
    labels = {
        "buffer": "jitter buffer (wait of pulled audio)",
        "lookahead": "lookahead delay (mel window)",
        "produce_late": "tick produced after due",
        "budget": "render budget (due -> leaves)",
        "render": "  of it: queue + render",
        "compose": "compose (paste, to VideoFrame)",
        "outside": "outside: net, codecs, jitter bufs",
    }
    lines = [f"  where a frame's audio->frame ms go:{'mean':>6}{'p50':>10}{'p95':>10}{'p99':>10}"]
    for name, p in stages.items():
        cells = "".join(f"{p.get(k, float('nan')):>10.1f}" for k in ("p50", "p95", "p99"))
        lines.append(f"    {labels.get(name, name):<36}{p['mean']:>6.1f}{cells}")
    return lines


def format_network(network: dict[str, dict[str, float]]) -> list[str]:
    lines = []
    for direction, t in network.items():
        packets = int(t.get("packets", 0))
        dropped = int(t.get("lost", 0) + t.get("queue_drops", 0))
        share = dropped / max(1, packets)
        lines.append(
            f"  impaired {direction}: {packets} RTP packets, {dropped} dropped ({share:.1%};"
            f" {int(t.get('queue_drops', 0))} by the rate limit), {int(t.get('reordered', 0))} reordered,"
            f" queue max {t.get('max_queue_ms', 0.0):.0f} ms"
        )
    return lines


def format_picture_recoveries(recoveries: list[float]) -> list[str]:
    if not recoveries:
        return []
    return [
        f"  picture broken {len(recoveries)} times (a packet given up, keyframe asked for): mended after"
        f" p50 {float(np.median(recoveries)):.0f} ms, max {max(recoveries):.0f} ms"
    ]


def format_server_rx(rx: dict[str, float]) -> list[str]:
    if not rx:
        return []
    return [
        f"  server inbound audio: {int(rx.get('lost', 0))} packets lost, {int(rx.get('fec', 0))} of them"
        f" rebuilt from FEC"
        f" ({int(rx.get('fec_missed', 0))} concealed before their FEC came);"
        f" {int(rx.get('late', 0))} late, {int(rx.get('reordered', 0))} reordered;"
        f" {rx.get('concealed_ms', 0.0):.0f} ms concealed; buffer target {rx.get('target_ms', 0.0):.0f} ms"
    ]


def format_recovery(recoveries: list[dict[str, Any]]) -> list[str]:
    return [
        f"  delay around the impaired stretch: before {r['before_ms']:.1f} ms,"
        f" during {r['during_ms']:.1f} ms, at the end {r['after_ms']:.1f} ms; back within 20 ms after"
        f" {_number(r['recovered_s'], '.0f')} s"
        for r in recoveries
    ]


def format_downlink_rate(rates: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rates:
        n = {k: _number(v, ".0f") if not isinstance(v, str) else v for k, v in r.items()}
        lines.append(
            f"  downlink capped at {n['cap_kbps']} kbps: the server sent video p50 {n['video_kbps_p50']} kbps"
            f" (max {n['video_kbps_max_after_5s']} after 5 s), under the cap from second"
            f" {n['under_cap_from_s']}; all media p50 {n['sent_kbps_p50']} kbps (max"
            f" {n['sent_kbps_max_after_5s']}), under from second {n['all_media_under_cap_from_s']};"
            f" frame latency p50 {n['frame_latency_first_half_ms']} -> {n['frame_latency_second_half_ms']} ms"
            " (first -> second half)"
        )
    return lines


def _number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def format_summary(url: str, s: dict[str, Any], failures: int) -> str:
    def row(name: str, p: dict[str, float]) -> str:
        cells = "".join(f"{p.get(k, float('nan')):>10.1f}" for k in ("p50", "p95", "p99"))
        return f"  {name:<28}{cells}"

    lines = [
        f"lipcast probe: {url}, {s['sessions']} session(s), {failures} failed",
        f"  {'':<28}{'p50':>10}{'p95':>10}{'p99':>10}",
        row("audio in -> mouth moves, ms", s["mouth_latency_ms"]),
        row("A/V offset (video later), ms", s["av_offset_ms"]),
        row("frame latency (metadata), ms", s["frame_latency_ms"]),
        row("audio in -> audio out, ms", s["audio_delay_ms"]),
        row("frame gap, ms", s["frame_gap_ms"]),
        f"  fps: min {s['fps_min']:.2f}, mean {s['fps_mean']:.2f}; gaps > 60 ms: {s['frame_gaps']};"
        f" freezes > 250 ms: {s['freezes']}; late (server) frames: {s['late_frames']}",
        f"  audio returned: min {s['audio_returned_min']:.2%}; audio gaps: {s['audio_gaps']}",
        f"  mouth follows speech: correlation min {_number(s.get('mouth_correlation_min'), '.3f')}",
        *format_server_rx(s.get("server_rx") or {}),
        *format_picture_recoveries(s.get("picture_recoveries_ms") or []),
        *[
            f"  keyframe lost on purpose: the picture mended {v:.0f} ms after its last good frame"
            for v in s.get("lost_keyframe_mended_ms") or []
        ],
        *format_recovery(s.get("delay_recovery") or []),
        *format_downlink_rate(s.get("downlink_rate") or []),
        *format_stages(s.get("stages_ms") or {}),
        *format_network(s.get("network") or {}),
        f"  bursts: {s['bursts_detected']}/{s['bursts']} seen moving; black box and metadata agree within one"
        f" frame on {s['metadata_agreement_within_1_frame']}/{s['metadata_compared']}",
    ]
    lines.extend(format_load(s.get("server_cpu") or {}, s.get("probe_cpu") or {}))
    if s["sessions"] > 1:
        knee = s["late_from_sessions"]
        lines.append(f"  frames start arriving late at: {knee if knee else 'not reached'} active sessions")
    return "\n".join(lines)


def check(s: dict[str, Any], limits: Thresholds) -> list[str]:
    missed = []
    mouth_p95 = s["mouth_latency_ms"].get("p95")
    if limits.max_mouth_latency_p95_ms is not None and (
        mouth_p95 is None or mouth_p95 > limits.max_mouth_latency_p95_ms
    ):
        missed.append(f"mouth latency p95 {mouth_p95} ms > {limits.max_mouth_latency_p95_ms}")
    offset_p95 = s["abs_av_offset_ms"].get("p95")
    if limits.max_av_offset_p95_ms is not None and (
        offset_p95 is None or offset_p95 > limits.max_av_offset_p95_ms
    ):
        missed.append(f"|A/V offset| p95 {offset_p95} ms > {limits.max_av_offset_p95_ms}")
    if limits.min_fps is not None and s["fps_min"] < limits.min_fps:
        missed.append(f"fps {s['fps_min']} < {limits.min_fps}")
    if limits.min_audio_returned is not None and s["audio_returned_min"] < limits.min_audio_returned:
        missed.append(f"audio returned {s['audio_returned_min']} < {limits.min_audio_returned}")
    return missed
