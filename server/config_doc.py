"""``docs/configuration.md``, generated from ``lipcast serve``'s parser so that the page cannot drift::

    .venv/bin/python -m lipcast.server.config_doc > docs/configuration.md

Every flag of :func:`lipcast.server.flags.build_parser` becomes a row: the flag, its default (from
:class:`lipcast.server.config.Settings`, or how ``settings_from`` fills it in), its ``LIPCAST_*`` variable
(from the help text, where ``_option`` puts it) and its help. ``Settings`` fields without a flag are listed
after it: ``settings_from`` reads them from the environment only. ``tests/test_docs.py`` fails when the
committed page differs from :func:`render_markdown`.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from lipcast.pipeline.defaults import CPU_BATCH_SIZES, CUDA_BATCH_SIZES
from lipcast.server.config import Settings
from lipcast.server.flags import ENV_PREFIX, build_parser

COMMAND = ".venv/bin/python -m lipcast.server.config_doc > docs/configuration.md"

# Defaults that ``Settings`` does not hold as such: ``settings_from`` computes them, or the field's None /
# empty value means "decided at start".
COMPUTED_DEFAULTS: dict[str, str] = {
    "media_workers": "cores - 1, at least 1 (1 with `--virtualcam`)",
    "builtin_hd_sizes": "`1280x720` (`lipcast serve`; none in a `Settings()` made in code)",
    "avatar_dirs": "none (the built-in avatars are always offered)",
    "jitter_buffer_ms": "`adaptive`",
    "render_budget_ms": "auto (see meaning)",
    "lookahead_ms": "the backend's",
    "gpus": "every visible GPU (with `cuda` or `auto`)",
    "batch_sizes": (
        f"`{','.join(map(str, CUDA_BATCH_SIZES))}` on CUDA, `{','.join(map(str, CPU_BATCH_SIZES))}` on a CPU"
    ),
    "torch_threads": "auto (see meaning)",
    "compile_cache_dir": "`~/.cache/lipcast/compile`",
    "upload_dir": "the first `--avatar-dir` (none: uploads are off)",
    "ice_addresses": "every interface",
    "virtualcam_device": "the first v4l2loopback device",
    "static_dir": "the `static/` folder of the lipcast package",
}

# What the settings without a flag do (they have no help text of their own).
ENV_ONLY_HELP: dict[str, str] = {
    "connect_timeout_s": "close a call or WHEP viewer whose connection is not up after this many seconds",
    "static_dir": "the folder of the call page, the viewer page and their scripts (served under `/static/`)",
}

_ENV_NOTE = re.compile(r"\s*\(env (" + ENV_PREFIX + r"[A-Z0-9_]+)([^)]*)\)\s*$")
_ENV_ANYWHERE = re.compile(r"\benv (" + ENV_PREFIX + r"[A-Z0-9_]+)")


def _settings_defaults() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(Settings):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


def _format_default(name: str, value: Any) -> str:
    if name in COMPUTED_DEFAULTS:
        return COMPUTED_DEFAULTS[name]
    if value is None or value == ():
        return "none"
    if isinstance(value, tuple):
        return ", ".join(_format_default(name, v) for v in value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, Path):
        if value.is_absolute():  # a path of this machine would make the page differ between checkouts
            raise ValueError(f"the default of {name!r} is an absolute path: add it to COMPUTED_DEFAULTS")
        return f"`{value}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flag_text(action: argparse.Action) -> str:
    flag = action.option_strings[-1]
    return f"`{flag} {action.metavar}`" if isinstance(action.metavar, str) else f"`{flag}`"


def _env_and_help(action: argparse.Action) -> tuple[str, str]:
    """The action's environment variable (with how a list is written there) and its help without it."""
    help_text = action.help or ""
    match = _ENV_NOTE.search(help_text)
    if match is not None:
        note = match.group(2).strip().lstrip(",").strip()
        env = f"`{match.group(1)}`" + (f" ({note})" if note else "")
        return env, help_text[: match.start()].rstrip()
    anywhere = _ENV_ANYWHERE.search(help_text)
    return (f"`{anywhere.group(1)}`" if anywhere else "-"), help_text


def _choices(action: argparse.Action) -> str:
    if action.choices is None:
        return ""
    return "; one of " + ", ".join(f"`{c}`" for c in action.choices)


def render_markdown() -> str:
    parser = build_parser()
    defaults = _settings_defaults()
    flagged: set[str] = set()
    lines = [
        "# Configuration",
        "",
        "*Generated from `lipcast serve`'s parser (`server/flags.py`, defaults from `server/config.py`) by",
        f"`{COMMAND}`; do not edit it by hand:",
        "`tests/test_docs.py` fails when it is stale.*",
        "",
        "Every setting of `lipcast serve` has an environment variable (`LIPCAST_` + the setting's name in",
        "capitals) and all but the last few a flag; a flag wins over its variable, a variable over the",
        "default. A repeatable flag's variable takes the whole list in one value, with the separator given.",
        "`lipcast serve --help` prints the same flags.",
        "",
        "| flag | default | environment | meaning |",
        "|---|---|---|---|",
    ]
    for action in parser._actions:
        if not action.option_strings:
            continue
        flagged.add(action.dest)
        env, help_text = _env_and_help(action)
        default = _format_default(action.dest, defaults.get(action.dest))
        row = (_flag_text(action), default, env, help_text + _choices(action))
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    env_only = [name for name in defaults if name not in flagged]
    if env_only:
        lines += [
            "",
            "## Environment only",
            "",
            "These settings have no flag; `lipcast serve` reads them from the environment.",
            "",
            "| environment | default | meaning |",
            "|---|---|---|",
        ]
        for name in env_only:
            cells = (
                f"`{ENV_PREFIX}{name.upper()}`",
                _format_default(name, defaults[name]),
                ENV_ONLY_HELP.get(name, ""),
            )
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
