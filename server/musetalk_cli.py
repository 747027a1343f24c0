"""``lipcast musetalk deviation``: streaming against offline MuseTalk audio features (spec 7.4)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def deviation(args: argparse.Namespace) -> int:
    from lipcast.pipeline.musetalk.deviation import main

    return main(args)


def add_commands(commands: Any) -> None:
    musetalk = commands.add_parser("musetalk", help="MuseTalk tools").add_subparsers(dest="musetalk_command")
    musetalk.required = True
    p = musetalk.add_parser(
        "deviation",
        help="how far live audio features are from the offline reference's, on given recordings",
        description="Feeds each recording to the live featurizer in 20 ms pieces and compares every frame's "
        "whisper window with the offline reference's (fp32), per hidden state, over speech, silence and 30 s "
        "boundaries; prints the table (docs/musetalk.md).",
    )
    add_arguments(p)
    p.set_defaults(handler=deviation)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The deviation tool's arguments (kept here: building the command line imports no torch)."""
    p.add_argument(
        "recordings", nargs="+", type=Path, help="speech recordings (WAV at 16 kHz, or any PyAV reads)"
    )
    p.add_argument("--weights", type=Path, help="a MuseTalk weights directory (its whisper encoder)")
    p.add_argument(
        "--random",
        choices=("full", "tiny"),
        default="full",
        help="without --weights: a random whisper-tiny (full) or the tests' small encoder",
    )
    p.add_argument("--lookahead-ms", default="0,40,80,120,200", help="comma-separated; inf: unlimited")
    p.add_argument("--context-s", default="30,10/5", help="comma-separated contexts W or W/R (R: rebase)")
    p.add_argument("--floor", default="running,input", help="comma-separated floor policies (or numbers)")
    p.add_argument(
        "--mel-only",
        action="store_true",
        help="only the encoder's input: each window's log-mel columns (no encoder, weight-free, fast)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--no-sanity", action="store_true")
    p.add_argument("--json", default="")
