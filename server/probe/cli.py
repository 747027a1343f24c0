"""``lipcast probe URL``: call a lipcast server, measure, print a summary, write JSON and PNG, gate on limits.

Exit status: 0 when every threshold given holds, 1 when one is missed, 2 when the probe could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt

from server.probe import analysis
from server.probe.client import CallRecording, call
from server.probe.load import HealthPoller, SelfSampler, clients_load, format_load, server_load
from server.probe.patterns import burst_pattern, load_audio
from server.probe.plot import write_plots
from server.probe.report import CallReport, analyse, percentiles
from streaming.rtc import restrict_host_addresses

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Thresholds:
    max_mouth_latency_p95_ms: float | None = None
    max_av_offset_p95_ms: float | None = None
    min_fps: float | None = None
    min_audio_returned: float | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", nargs="?", default="http://127.0.0.1:8080", help="the lipcast server")
    p.add_argument("--wav", type=Path, help="send this audio file instead of the generated bursts")
    p.add_argument("--duration-s", type=float, default=12.0, help="length of the generated pattern")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated pattern")
    p.add_argument("--avatar", help="avatar name")
    p.add_argument("--sessions", type=int, default=1, help="concurrent sessions (load mode when > 1)")
    p.add_argument("--ramp-s", type=float, default=0.0, help="start the sessions spread over this time")
    p.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="spread the sessions' clients over this many processes (one Python process holds ~10 calls)",
    )
    p.add_argument("--json", type=Path, help="write the full results here")
    p.add_argument(
        "--video-release",
        choices=("aiortc", "marker"),
        default="aiortc",
        help="when the probe's receiver hands a video frame to its decoder: aiortc's way (at the next frame's"
        " first packet, 40 ms later) or a browser's (on the frame's last packet, the RTP marker bit)",
    )
    p.add_argument(
        "--png",
        type=Path,
        help="write the latency histogram and timeline here, and as SVG beside it (needs lipcast[probe])",
    )
    p.add_argument("--max-mouth-latency-p95-ms", type=float)
    p.add_argument("--max-av-offset-p95-ms", type=float, help="limit on |A/V offset| p95")
    p.add_argument("--min-fps", type=float, help="limit on every session's received fps")
    p.add_argument("--min-audio-returned", type=float, help="share of sent audio that must return, 0..1")
    p.add_argument(
        "--push",
        action="store_true",
        help="measure a push session instead of a call: push -> voice/mouth, interrupt -> silence/rest",
    )
    p.add_argument("--push-cycles", type=int, default=10, help="--push: utterances pushed and interrupted")
    p.add_argument(
        "--push-speak-s", type=float, default=1.0, help="--push: how long each plays before the interrupt"
    )
    p.add_argument("--token", help="bearer token of the server (--push)")
    p.add_argument(
        "--ice-address",
        action="append",
        dest="ice_addresses",
        metavar="ADDR",
        help="offer only these local addresses as ICE host candidates (e.g. 127.0.0.1)",
    )


async def _record_and_analyse(
    url: str,
    audio: npt.NDArray[np.int16],
    indices: list[int],
    sessions: int,
    ramp_s: float,
    avatar: str | None,
    http: aiohttp.ClientSession,
    video_release: str = "aiortc",
) -> tuple[list[CallReport | BaseException], dict[str, Any]]:
    """Run the calls ``indices`` of ``sessions`` (each starting at its place in the ramp), then analyse
    them: analysis waits until every call here has ended, so it never competes with a live call's media.
    Also returns this process's CPU figures over the calls (:class:`~server.probe.load.SelfSampler`)."""

    async def one(i: int) -> CallRecording:
        await asyncio.sleep(ramp_s * i / max(1, sessions))
        return await call(url, audio, avatar=avatar, http=http, video_release=video_release)

    sampler = SelfSampler()
    sampler.start()
    recordings = await asyncio.gather(*(one(i) for i in indices), return_exceptions=True)
    cpu = await sampler.stop()
    loop = asyncio.get_running_loop()
    results: list[CallReport | BaseException] = []
    for recording in recordings:
        if isinstance(recording, BaseException):
            results.append(recording)
            continue
        try:
            results.append(await loop.run_in_executor(None, analyse, recording))
        except Exception as e:  # one call's analysis failing is that call's failure
            results.append(e)
    return results, cpu


async def run_sessions(
    url: str,
    audio: npt.NDArray[np.int16],
    sessions: int,
    ramp_s: float,
    avatar: str | None,
    video_release: str = "aiortc",
) -> tuple[list[CallReport | BaseException], dict[str, Any], list[dict[str, Any]]]:
    """All calls from this process. Returns the reports, the server's load, this process's CPU."""
    async with aiohttp.ClientSession() as http:
        poller = HealthPoller(http, url)
        poller.start()
        try:
            results, cpu = await _record_and_analyse(
                url, audio, list(range(sessions)), sessions, ramp_s, avatar, http, video_release
            )
        finally:
            await poller.stop()
        return results, server_load(poller.samples), [cpu]


def _client_process(
    url: str,
    audio: npt.NDArray[np.int16],
    indices: list[int],
    sessions: int,
    ramp_s: float,
    avatar: str | None,
    ice_addresses: list[str] | None,
) -> tuple[list[CallReport | str], dict[str, Any]]:
    """One client process of a spread-out load: its share of the calls (picklable results back)."""
    if ice_addresses:
        restrict_host_addresses(ice_addresses)

    async def run() -> tuple[list[CallReport | BaseException], dict[str, Any]]:
        async with aiohttp.ClientSession() as http:
            return await _record_and_analyse(url, audio, indices, sessions, ramp_s, avatar, http)

    results, cpu = asyncio.run(run())
    return [r if isinstance(r, CallReport) else f"{type(r).__name__}: {r}" for r in results], cpu


async def run_spread(
    url: str,
    audio: npt.NDArray[np.int16],
    sessions: int,
    ramp_s: float,
    avatar: str | None,
    processes: int,
    ice_addresses: list[str] | None,
) -> tuple[list[CallReport | BaseException], dict[str, Any], list[dict[str, Any]]]:
    """``run_sessions`` with the clients spread round-robin over ``processes`` processes."""
    import concurrent.futures
    import multiprocessing

    shares = [list(range(k, sessions, processes)) for k in range(processes)]
    context = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as http:
        poller = HealthPoller(http, url)
        poller.start()
        try:
            with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
                parts = await asyncio.gather(
                    *(
                        loop.run_in_executor(
                            pool, _client_process, url, audio, share, sessions, ramp_s, avatar, ice_addresses
                        )
                        for share in shares
                        if share
                    )
                )
        finally:
            await poller.stop()
    results: list[CallReport | BaseException] = [
        r if isinstance(r, CallReport) else RuntimeError(r) for part, _ in parts for r in part
    ]
    return results, server_load(poller.samples), [cpu for _, cpu in parts]


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
        "audio_gaps": sum(r.audio_gaps for r in reports),
        "bursts": len(bursts),
        "bursts_detected": sum(1 for b in bursts if b.mouth_latency_ms is not None),
        "metadata_agreement_within_1_frame": sum(1 for a, b in frame_pairs if abs(a - b) <= 1),
        "metadata_compared": len(frame_pairs),
        "late_from_sessions": knee.get("late_from_sessions"),
        "stages_ms": stage_breakdown(reports),
    }


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
        *format_stages(s.get("stages_ms") or {}),
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


def main(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    if args.push:
        from server.probe import push_probe

        if args.ice_addresses:
            restrict_host_addresses(args.ice_addresses)
        return push_probe.main(args)
    try:
        audio = load_audio(args.wav) if args.wav else burst_pattern(args.duration_s, seed=args.seed)
    except (OSError, ValueError) as e:
        print(f"lipcast probe: {e}")
        return 2
    if args.ice_addresses:
        restrict_host_addresses(args.ice_addresses)
    started = time.time()
    if args.client_processes > 1:
        results, cpu, clients = asyncio.run(
            run_spread(
                url,
                audio,
                args.sessions,
                args.ramp_s,
                args.avatar,
                args.client_processes,
                args.ice_addresses,
            )
        )
    else:
        results, cpu, clients = asyncio.run(
            run_sessions(url, audio, args.sessions, args.ramp_s, args.avatar, args.video_release)
        )
    reports = [r for r in results if isinstance(r, CallReport)]
    errors = [r for r in results if not isinstance(r, CallReport)]
    for error in errors:
        print(f"session failed: {error}")
    if not reports:
        return 2
    knee = late_knee(reports)
    s = summary(reports, knee)
    s["server_cpu"] = cpu
    s["probe_cpu"] = clients_load(clients, sum(r.frames for r in reports))
    print(format_summary(url, s, len(errors)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "url": url,
            "started": started,
            "summary": s,
            "load": knee,
            "sessions": [r.to_json() for r in reports],
            "errors": [str(e) for e in errors],
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if args.png:
        write_plots(args.png, reports, f"lipcast probe: {url}, {len(reports)} session(s)")
    missed = check(
        s,
        Thresholds(
            args.max_mouth_latency_p95_ms, args.max_av_offset_p95_ms, args.min_fps, args.min_audio_returned
        ),
    )
    for line in missed:
        print(f"THRESHOLD MISSED: {line}")
    return 1 if missed or errors else 0
