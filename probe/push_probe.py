"""``lipcast probe --push URL``: measure a push session from outside, as a voice agent sees it.

One push session and one WHEP viewer. Each cycle pushes an utterance the way a TTS does (all of it at once,
far faster than real time), waits until its voice is playing, interrupts it mid-way and waits through the
quiet. Times are taken where the client sees them:

* push -> voice out: the utterance's message leaving -> the first received audio chunk above -40 dBFS;
* push -> mouth moves: the same start -> the first video frame whose mouth region moved (pixels);
* interrupt -> silence: the interrupt leaving -> the arrival of the first audio chunk after which all are
  quiet (until the next utterance);
* interrupt -> mouth at rest: the interrupt leaving -> the first frame after which every mouth region is
  at rest (and the meta channel says ``active: false``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import aiohttp
import numpy as np

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ
from lipcast.probe.patterns import VOWELS_HZ, vowel
from lipcast.probe.push_client import open_push
from lipcast.probe.report import motion_threshold, percentiles
from lipcast.probe.wish import Peer, open_viewer

LOUD_DBFS = -40.0


def utterance(duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Continuous speech-like syllables (no pauses, so any quiet after an interrupt is the interrupt's)."""
    parts = []
    total = 0
    while total < duration_s * MEDIA_SAMPLE_RATE_HZ:
        sound = vowel(rng.uniform(0.15, 0.3), rng.uniform(100, 220), VOWELS_HZ[rng.integers(5)], 0.3, rng)
        parts.append(sound)
        total += len(sound)
    audio = np.concatenate(parts)
    return np.clip(np.round(audio * 32767), -32768, 32767).astype(np.int16)


def loud(chunk: np.ndarray) -> bool:
    x = chunk.astype(np.float64) / 32768.0
    return bool(10 * np.log10(np.mean(x * x) + 1e-12) > LOUD_DBFS)


def first_after(times: list[float], flags: list[bool], t0: float, t1: float) -> float | None:
    for t, flag in zip(times, flags, strict=True):
        if t0 <= t < t1 and flag:
            return t
    return None


def settled_after(times: list[float], busy: list[bool], t0: float, t1: float) -> float | None:
    """The first time in [t0, t1) after which no event up to t1 is ``busy``."""
    inside = [(t, b) for t, b in zip(times, busy, strict=True) if t0 <= t < t1]
    if not inside:
        return None
    last_busy = max((i for i, (_, b) in enumerate(inside) if b), default=-1)
    if last_busy + 1 >= len(inside):
        return None
    return inside[last_busy + 1][0]


async def run(url: str, cycles: int, speak_s: float, avatar: str | None, token: str | None) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    async with aiohttp.ClientSession() as http:
        push = await open_push(http, url, MEDIA_SAMPLE_RATE_HZ, avatar=avatar, token=token)
        viewer: Peer | None = None
        marks: list[tuple[float, float]] = []  # (pushed at, interrupted at)
        try:
            viewer = await open_viewer(http, url, push.session_id, token=token, avatar=avatar)
            await viewer.wait_connected()
            await asyncio.sleep(1.5)  # the resting mouth, for the motion threshold
            rest_until = time.monotonic()
            for _ in range(cycles):
                audio = utterance(speak_s + 2.0, rng)
                pushed = time.monotonic()
                await push.send_pcm(audio)
                await asyncio.sleep(speak_s)
                interrupted = await push.control("interrupt")
                await push.wait_reply("interrupted", after=len(push.replies))
                marks.append((pushed, interrupted))
                await asyncio.sleep(1.5)
            await asyncio.sleep(0.3)
        finally:
            if viewer is not None:
                await viewer.close()
            await push.close()
    return analyse(viewer, marks, rest_until)


def analyse(viewer: Peer, marks: list[tuple[float, float]], rest_until: float) -> dict[str, Any]:
    audio_t = viewer.audio.arrived_at
    audio_loud = [loud(c) for c in viewer.audio.chunks]
    regions = viewer.frame_regions()
    arrivals = viewer.frame_arrivals()
    meta = {int(m["frame"]): m for _, m in viewer.meta}
    frames = sorted(set(regions) & set(arrivals))
    frame_t = [arrivals[f] for f in frames]
    resting = [regions[f] for f in frames if arrivals[f] < rest_until]
    reference = np.median(np.stack(resting[:25]).astype(np.float64), axis=0)
    motion = np.asarray([np.abs(regions[f].astype(np.float64) - reference).mean() for f in frames])
    silent = np.asarray([t < rest_until for t in frame_t])
    threshold = motion_threshold(motion, silent)
    moving = [bool(m > threshold) for m in motion]
    active = [(f in meta and meta[f]["active"]) or mv for f, mv in zip(frames, moving, strict=True)]
    voice_out, mouth_moves, to_silence, to_rest = [], [], [], []
    ends = [m[0] for m in marks[1:]] + [float("inf")]
    for (pushed, interrupted), until in zip(marks, ends, strict=True):
        t = first_after(audio_t, audio_loud, pushed, interrupted)
        voice_out.append(None if t is None else (t - pushed) * 1000.0)
        t = first_after(frame_t, moving, pushed, interrupted)
        mouth_moves.append(None if t is None else (t - pushed) * 1000.0)
        t = settled_after(audio_t, audio_loud, interrupted, until)
        to_silence.append(None if t is None else max(0.0, (t - interrupted) * 1000.0))
        t = settled_after(frame_t, active, interrupted, until)
        to_rest.append(None if t is None else max(0.0, (t - interrupted) * 1000.0))
    return {
        "cycles": len(marks),
        "motion_threshold": round(threshold, 2),
        "push_to_voice_out_ms": percentiles([v for v in voice_out if v is not None], (50, 95)),
        "push_to_mouth_moves_ms": percentiles([v for v in mouth_moves if v is not None], (50, 95)),
        "interrupt_to_silence_ms": percentiles([v for v in to_silence if v is not None], (50, 95)),
        "interrupt_to_mouth_at_rest_ms": percentiles([v for v in to_rest if v is not None], (50, 95)),
        "measured": {
            "voice_out": sum(v is not None for v in voice_out),
            "mouth_moves": sum(v is not None for v in mouth_moves),
            "silence": sum(v is not None for v in to_silence),
            "mouth_at_rest": sum(v is not None for v in to_rest),
        },
        "per_cycle_ms": {
            "voice_out": voice_out,
            "mouth_moves": mouth_moves,
            "silence": to_silence,
            "mouth_at_rest": to_rest,
        },
    }


def format_summary(url: str, s: dict[str, Any]) -> str:
    def row(name: str, key: str) -> str:
        p = s[key]
        return f"  {name:<32}{p.get('p50', float('nan')):>10.1f}{p.get('p95', float('nan')):>10.1f}"

    m = s["measured"]
    return "\n".join(
        [
            f"lipcast probe --push: {url}, {s['cycles']} utterance(s) pushed and interrupted",
            f"  {'':<32}{'p50':>10}{'p95':>10}",
            row("push -> voice out, ms", "push_to_voice_out_ms"),
            row("push -> mouth moves, ms", "push_to_mouth_moves_ms"),
            row("interrupt -> silence, ms", "interrupt_to_silence_ms"),
            row("interrupt -> mouth at rest, ms", "interrupt_to_mouth_at_rest_ms"),
            f"  measured in: voice {m['voice_out']}, mouth {m['mouth_moves']}, silence {m['silence']},"
            f" rest {m['mouth_at_rest']} of {s['cycles']}",
        ]
    )


def main(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    try:
        s = asyncio.run(run(url, args.push_cycles, args.push_speak_s, args.avatar, args.token))
    except (aiohttp.ClientError, ConnectionError, TimeoutError, RuntimeError) as e:
        print(f"lipcast probe --push: {e}")
        return 2
    print(format_summary(url, s))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"url": url, "push": s}, indent=1) + "\n")
    return 0 if all(s["measured"][k] == s["cycles"] for k in s["measured"]) else 1
