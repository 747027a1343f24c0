"""``lipcast avatar prepare INPUT --name NAME``: a video or photo of a face -> an avatar directory."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

from lipcast.pipeline.avatar_prepare import DEFAULT_MAX_DURATION_S, DEFAULT_MAX_SIDE_PX


def _box(text: str) -> tuple[float, float, float, float]:
    try:
        x1, y1, x2, y2 = (float(v) for v in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected x1,y1,x2,y2, got {text!r}") from e
    return x1, y1, x2, y2


class ProgressLine:
    """Frames done on stderr: one line that rewrites itself on a terminal, else a line a second."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.perf_counter()
        self.shown = -1.0
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int | None) -> None:
        now = time.perf_counter()
        if now - self.shown < (0.2 if self.tty else 1.0) and done != total:
            return
        self.shown = now
        of = f"/{total} frames ({100 * done // total}%)" if total else " frames"
        text = f"{self.label}: {done}{of}, {now - self.started:.1f} s"
        print(f"\r{text}" if self.tty else text, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty and self.shown >= 0:
            print(file=sys.stderr)


def prepare(args: argparse.Namespace) -> int:
    from lipcast.pipeline.avatar import AvatarError
    from lipcast.pipeline.avatar_prepare import PrepareOptions, prepare_avatar

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options = PrepareOptions(
        max_side_px=args.max_side_px,
        max_duration_s=args.max_seconds,
        box=args.box,
        detector_model=args.detector_model,
    )
    if args.backend == "musetalk":  # the weights first: a bad directory leaves no avatar behind
        problem = _musetalk_weights_problem(args)
        if problem:
            print(f"lipcast avatar prepare: {problem}", file=sys.stderr)
            return 2
    progress = ProgressLine(f"preparing {args.name}")
    started = time.perf_counter()
    try:
        avatar = prepare_avatar(
            args.input, args.name, args.out, options, progress=progress, overwrite=args.force
        )
    except AvatarError as e:
        progress.close()
        print(f"lipcast avatar prepare: {e}", file=sys.stderr)
        return 1
    progress.close()
    if args.backend == "musetalk":
        code = _musetalk_cache(avatar, args)
        if code:
            return code
    elapsed = time.perf_counter() - started
    print(
        f"avatar {avatar.name!r}: {avatar.frame_count} frame(s), {avatar.width}x{avatar.height}, in "
        f"{args.out / avatar.name} ({elapsed:.1f} s)\n"
        f"serve it with: lipcast serve --avatar-dir {args.out} --avatar {avatar.name}"
    )
    return 0


def _musetalk_weights_problem(args: argparse.Namespace) -> str:
    if args.musetalk_weights is None:
        return "--backend musetalk needs --musetalk-weights DIR"
    from lipcast.pipeline.musetalk.weights import MuseTalkWeightsError, find_weights

    try:
        find_weights(args.musetalk_weights)
    except MuseTalkWeightsError as e:
        return str(e)
    return ""


def _musetalk_cache(avatar: Any, args: argparse.Namespace) -> int:
    """``--backend musetalk``: cache the avatar's face boxes, latent pairs and blend masks (the avatar stays
    usable by every backend; the cache is what MuseTalk would otherwise compute when the avatar is added)."""
    try:
        from lipcast.pipeline.musetalk.cache import prepare_cache
        from lipcast.pipeline.musetalk.weights import MuseTalkWeightsError

        folder = prepare_cache(avatar, args.musetalk_weights, args.musetalk_latent, args.device)
    except (ImportError, ValueError, MuseTalkWeightsError) as e:
        print(f"lipcast avatar prepare: musetalk cache: {e}", file=sys.stderr)
        return 1
    print(f"musetalk cache ({args.musetalk_latent} latents, geometric jaw masks) in {folder}")
    return 0


def add_commands(commands: Any) -> None:
    """Add ``avatar prepare`` to the ``lipcast`` command's subparsers."""
    avatar = commands.add_parser("avatar", help="avatar tools").add_subparsers(dest="avatar_command")
    avatar.required = True
    p = avatar.add_parser(
        "prepare",
        help="make an avatar from a video or a photo of a face",
        description="Decode INPUT (a video or an image), find the face in every frame, smooth it over time "
        "and write the avatar directory OUT/NAME, which `lipcast serve --avatar-dir OUT` offers.",
    )
    p.add_argument("input", type=Path, metavar="INPUT", help="a video (mp4, webm, mov, ...) or an image")
    p.add_argument("--name", required=True, help="avatar name: lowercase letters, digits, - and _")
    p.add_argument("--out", type=Path, default=Path("avatars"), help="avatars directory (default: ./avatars)")
    p.add_argument(
        "--box",
        type=_box,
        metavar="X1,Y1,X2,Y2",
        help="the face by hand, in INPUT's pixels (cheek to cheek, forehead to chin), for every frame",
    )
    p.add_argument(
        "--detector-model",
        type=Path,
        metavar="ONNX",
        help="a YuNet face detector model (face_detection_yunet_*.onnx): steadier boxes and real eye and "
        "mouth landmarks; default: OpenCV's Haar cascade",
    )
    p.add_argument(
        "--max-side-px",
        type=int,
        default=DEFAULT_MAX_SIDE_PX,
        help=f"scale frames to at most this many pixels a side (default {DEFAULT_MAX_SIDE_PX})",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=DEFAULT_MAX_DURATION_S,
        help=f"keep at most this much of a video (default {DEFAULT_MAX_DURATION_S:g} s)",
    )
    p.add_argument("--force", action="store_true", help="replace an avatar of the same name")
    p.add_argument(
        "--backend",
        choices=("builtin", "wav2lip", "musetalk"),
        default="builtin",
        help="musetalk: also cache MuseTalk's face boxes, latents and blend masks (needs --musetalk-weights);"
        " the others derive theirs when the server adds the avatar",
    )
    p.add_argument("--musetalk-weights", type=Path, metavar="DIR", help="MuseTalk 1.5 weights directory")
    p.add_argument(
        "--musetalk-latent",
        choices=("mean", "sample"),
        default="mean",
        help="the VAE posterior's mean (deterministic, as in training; default) or a sample (the reference)",
    )
    p.add_argument("--device", default="cpu", help="where the VAE encodes (cpu, cuda, cuda:N)")
    p.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default WARNING)")
    p.set_defaults(handler=prepare)
