"""``lipcast probe URL``: call a lipcast server, measure, print a summary, write JSON and PNG, gate on limits.

Exit status: 0 when every threshold given holds, 1 when one is missed, 2 when the probe could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt

from lipcast.probe.client import DEFAULT_OPTIONS, CallOptions, CallRecording, call
from lipcast.probe.impair import DIRECTIONS, Impairment, ImpairmentError, Network
from lipcast.probe.load import PROBE_LOOP_STALL_MS, HealthPoller, SelfSampler, clients_load, server_load
from lipcast.probe.patterns import burst_pattern, load_audio
from lipcast.probe.plot import write_plots
from lipcast.probe.report import CallReport, analyse
from lipcast.probe.summary import Thresholds, check, format_summary, late_knee, summary
from lipcast.streaming.loop_stalls import LoopStallWatch, Stall, freeze_startup_heap
from lipcast.streaming.rtc import restrict_host_addresses

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", nargs="?", default="http://127.0.0.1:8080", help="the lipcast server")
    p.add_argument("--wav", type=Path, help="send this audio file instead of the generated bursts")
    p.add_argument("--duration-s", type=float, default=12.0, help="length of the generated pattern")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the generated pattern and of the network impairment"
    )
    p.add_argument("--avatar", help="avatar name")
    p.add_argument("--size", help="the video size each call asks for, WIDTHxHEIGHT (default: the avatar's)")
    p.add_argument("--codec", choices=("vp8", "h264"), help="the only video codec each call offers")
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
        "--impair",
        metavar="SPEC",
        help="impair the call's RTP in the probe's own transport, e.g."
        ' "loss=2%%,burst=4,delay=40ms,jitter=30ms,rate=300kbps" (queue=MS: the rate-limited'
        " link's queue, 300 ms by default; from=S,until=S: impair only that stretch of the call);"
        " seeded by --seed",
    )
    p.add_argument(
        "--impair-direction",
        choices=DIRECTIONS,
        default="up",
        help="which way --impair applies: up (probe -> server), down (server -> probe) or both",
    )
    p.add_argument(
        "--lose-keyframe-at-s",
        type=float,
        metavar="S",
        help="S seconds into the call, ask for a keyframe and lose all of its packets in the probe's"
        " receiver, then time how soon the picture is mended (needs --video-release marker)",
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


def call_options(args: argparse.Namespace) -> CallOptions:
    """How each call of this run is made: the receiver's video release, the network impairment if any."""
    network = None
    if args.impair:
        network = Network(Impairment.parse(args.impair), args.impair_direction, args.seed)
    if args.lose_keyframe_at_s is not None and args.video_release != "marker":
        raise ImpairmentError("--lose-keyframe-at-s needs --video-release marker")
    return CallOptions(
        video_release=args.video_release,
        network=network,
        lose_keyframe_at_s=args.lose_keyframe_at_s,
        size=args.size,
        codec=args.codec,
    )


async def _record_and_analyse(
    url: str,
    audio: npt.NDArray[np.int16],
    indices: list[int],
    sessions: int,
    ramp_s: float,
    avatar: str | None,
    http: aiohttp.ClientSession,
    options: CallOptions = DEFAULT_OPTIONS,
) -> tuple[list[CallReport | BaseException], dict[str, Any]]:
    """Run the calls ``indices`` of ``sessions`` (each starting at its place in the ramp), then analyse
    them: analysis waits until every call here has ended, so it never competes with a live call's media.
    Also returns this process's CPU figures over the calls (:class:`~lipcast.probe.load.SelfSampler`) and its
    own event-loop stalls: a client that stalls sends its audio late, and the server's latency looks worse
    by as much (its heap is frozen out of the garbage collector first, as the server's is)."""

    async def one(i: int) -> CallRecording:
        await asyncio.sleep(ramp_s * i / max(1, sessions))
        return await call(url, audio, avatar=avatar, http=http, options=options)

    freeze_startup_heap()
    stalls: list[Stall] = []
    watch = LoopStallWatch(PROBE_LOOP_STALL_MS, on_stall=stalls.append)
    watch.start()
    sampler = SelfSampler()
    sampler.start()
    try:
        recordings = await asyncio.gather(*(one(i) for i in indices), return_exceptions=True)
    finally:
        watch.stop()
    cpu = await sampler.stop()
    if cpu:
        cpu["loop_stalls_ms"] = [stall.duration_ms for stall in stalls]
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
    options: CallOptions = DEFAULT_OPTIONS,
) -> tuple[list[CallReport | BaseException], dict[str, Any], list[dict[str, Any]]]:
    """All calls from this process. Returns the reports, the server's load, this process's CPU."""
    async with aiohttp.ClientSession() as http:
        poller = HealthPoller(http, url)
        poller.start()
        try:
            results, cpu = await _record_and_analyse(
                url, audio, list(range(sessions)), sessions, ramp_s, avatar, http, options
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
    options: CallOptions,
) -> tuple[list[CallReport | str], dict[str, Any]]:
    """One client process of a spread-out load: its share of the calls (picklable results back)."""
    if ice_addresses:
        restrict_host_addresses(ice_addresses)

    async def run() -> tuple[list[CallReport | BaseException], dict[str, Any]]:
        async with aiohttp.ClientSession() as http:
            return await _record_and_analyse(url, audio, indices, sessions, ramp_s, avatar, http, options)

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
    options: CallOptions = DEFAULT_OPTIONS,
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
                            pool,
                            _client_process,
                            url,
                            audio,
                            share,
                            sessions,
                            ramp_s,
                            avatar,
                            ice_addresses,
                            options,
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


def add_command(commands: Any) -> None:
    """Add ``probe`` to the ``lipcast`` command's subparsers."""
    parser = commands.add_parser("probe", help="measure a running server from outside")
    add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return main(args)


def main(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    if args.push:
        from lipcast.probe import push_probe

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
    try:
        options = call_options(args)
    except ImpairmentError as e:
        print(f"lipcast probe: {e}")
        return 2
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
                options,
            )
        )
    else:
        results, cpu, clients = asyncio.run(
            run_sessions(url, audio, args.sessions, args.ramp_s, args.avatar, options)
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
