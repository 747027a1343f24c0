"""The ``lipcast`` command: ``lipcast serve`` (the default) and the tools that later issues add."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from server import avatar_cli, engine_cli, tools_cli
from server.flags import build_parser, settings_from
from server.probe.cli import add_arguments as add_probe_arguments
from streaming.memory import keep_frame_buffers_in_heap
from streaming.rtc import restrict_host_addresses

logger = logging.getLogger("lipcast")


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aioice").setLevel(logging.WARNING)
    logging.getLogger("aiortc").setLevel(logging.WARNING)


def serve(args: argparse.Namespace) -> int:
    from server.app import create_app
    from server.serve import serve_until_signalled
    from server.virtualcam import VirtualCameraError
    from server.virtualcam import check_available as check_virtualcam

    try:
        settings = settings_from(args)
    except ValueError as e:
        print(f"lipcast serve: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
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


def probe(args: argparse.Namespace) -> int:
    from server.probe.cli import main as probe_main

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return probe_main(args)


def build_cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lipcast", description="Streaming WebRTC lip-sync avatar server")
    commands = parser.add_subparsers(dest="command")
    serve_parser = commands.add_parser("serve", parents=[build_parser()], help="run the server")
    serve_parser.set_defaults(handler=serve)
    probe_parser = commands.add_parser("probe", help="measure a running server from outside")
    add_probe_arguments(probe_parser)
    probe_parser.set_defaults(handler=probe)
    avatar_cli.add_commands(commands)
    tools_cli.add_commands(commands)
    engine_cli.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, "serve")
    args = build_cli().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
