"""The server's commands of ``lipcast`` (:mod:`lipcast.cli` assembles the whole command line): ``serve`` and
the tools that prepare avatars, render files offline and build the engine's caches."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from lipcast.server import avatar_cli, engine_cli, musetalk_cli, tools_cli
from lipcast.server.config import Settings
from lipcast.server.flags import build_parser, settings_from
from lipcast.streaming.memory import keep_frame_buffers_in_heap
from lipcast.streaming.rtc import restrict_host_addresses

logger = logging.getLogger("lipcast")


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aioice").setLevel(logging.WARNING)
    logging.getLogger("aiortc").setLevel(logging.WARNING)


def serve(args: argparse.Namespace) -> int:
    from lipcast.server.app import create_app
    from lipcast.server.serve import serve_until_signalled
    from lipcast.server.virtualcam import VirtualCameraError
    from lipcast.server.virtualcam import check_available as check_virtualcam

    try:
        settings = settings_from(args)
    except ValueError as e:
        print(f"lipcast serve: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    problem = face_enhance_problem(settings)
    if problem is not None:
        print(f"lipcast serve: {problem}", file=sys.stderr)
        return 2
    if settings.ice_addresses:
        restrict_host_addresses(settings.ice_addresses)
    keep_frame_buffers_in_heap()  # the front renders (patches, batches); with one process it also encodes
    logger.info("lipcast on http://%s:%d (backend %s)", settings.host, settings.port, settings.backend)
    try:
        if settings.virtualcam:
            check_virtualcam(settings.virtualcam_device)
        app = create_app(settings)
        asyncio.run(serve_until_signalled(app, settings.host, settings.port, settings.drain_timeout_s))
    except VirtualCameraError as e:
        print(f"lipcast serve: {e}", file=sys.stderr)
        return 2
    return 0


def face_enhance_problem(settings: Settings) -> str | None:
    """Why ``serve`` must not start with these face post-processing settings (None: it may), said before
    anything else starts: the restorer file missing, corrupt or of an unsupported kind (path and reason),
    spandrel not installed, or sharpen by default on a CPU without --face-enhance-allow-cpu."""
    if settings.face_enhance_weights is None:
        return None
    from lipcast.pipeline.devices import resolve_devices
    from lipcast.pipeline.enhance.options import SHARPEN
    from lipcast.pipeline.enhance.weights import EnhanceUnavailableError, EnhanceWeightsError, load_restorer

    try:
        load_restorer(settings.face_enhance_weights)
    except (EnhanceWeightsError, EnhanceUnavailableError) as e:
        return str(e)
    on_cpu = resolve_devices(settings.device, settings.gpus)[0].type == "cpu"
    if settings.face_enhance == SHARPEN and on_cpu and not settings.face_enhance_allow_cpu:
        return (
            "--face-enhance sharpen on a CPU-only server is too slow for live calls;"
            " --face-enhance-allow-cpu allows it"
        )
    return None


def add_commands(commands: Any) -> None:
    """Add ``serve`` and the server's tools to the ``lipcast`` command's subparsers."""
    serve_parser = commands.add_parser("serve", parents=[build_parser()], help="run the server")
    serve_parser.set_defaults(handler=serve)
    avatar_cli.add_commands(commands)
    tools_cli.add_commands(commands)
    engine_cli.add_commands(commands)
    musetalk_cli.add_commands(commands)
