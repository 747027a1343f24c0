"""The ``lipcast`` command (and ``python -m lipcast``): the server's commands and the harness side by side.

``lipcast serve`` (the default when the first argument is an option or missing) and the server's tools come
from :mod:`lipcast.server.cli`; ``lipcast probe`` from :mod:`lipcast.probe.cli`. The harness is a client of
the server: neither imports the other, they meet only here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lipcast.probe import cli as probe_cli
from lipcast.server import cli as server_cli


def build_cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lipcast", description="Streaming WebRTC lip-sync avatar server")
    commands = parser.add_subparsers(dest="command")
    server_cli.add_commands(commands)
    probe_cli.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, "serve")
    args = build_cli().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
