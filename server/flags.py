"""``lipcast serve``'s flags and ``LIPCAST_*`` environment variables -> one :class:`~server.config.Settings`.

Precedence: flag > environment > default. The environment variable of a field is ``LIPCAST_`` + its name in
capitals; list fields are comma-separated (``LIPCAST_AVATAR_DIRS``: ``:``-separated).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from pipeline.defaults import BACKENDS, CPU_WAV2LIP_RENDER_BUDGET_MS, RENDER_BUDGET_MS
from server.config import RENDER_PLACES, IceServer, Settings, default_media_workers

ENV_PREFIX = "LIPCAST_"


def add_repeatable(
    p: argparse.ArgumentParser, flag: str, dest: str, metavar: str, help_text: str, value: Any = str
) -> None:
    """A flag that may be given several times; its values collect in a list under ``dest``."""
    p.add_argument(flag, action="append", dest=dest, metavar=metavar, type=value, help=help_text)


def _ice_servers(urls: Sequence[str], username: str | None, credential: str | None) -> tuple[IceServer, ...]:
    servers = []
    for url in urls:
        url = url.strip()
        if not url:
            continue
        if not url.startswith(("stun:", "turn:", "turns:")):
            raise ValueError(f"ICE server URL must start with stun:, turn: or turns:, got {url!r}")
        is_turn = url.startswith("turn")
        servers.append(IceServer((url,), username if is_turn else None, credential if is_turn else None))
    return tuple(servers)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--host", help="address to listen on (env LIPCAST_HOST)")
    p.add_argument("--port", type=int, help="HTTP port (env LIPCAST_PORT)")
    add_repeatable(
        p,
        "--ice-server",
        "ice_servers",
        "URL",
        "STUN/TURN URL, repeatable (env LIPCAST_ICE_SERVERS, comma-separated)",
    )
    add_repeatable(
        p,
        "--ice-address",
        "ice_addresses",
        "ADDR",
        "offer only this local address as an ICE host candidate, repeatable "
        "(env LIPCAST_ICE_ADDRESSES, comma-separated)",
    )
    p.add_argument("--ice-username", help="TURN username (env LIPCAST_ICE_USERNAME)")
    p.add_argument("--ice-credential", help="TURN credential (env LIPCAST_ICE_CREDENTIAL)")
    p.add_argument("--max-sessions", type=int, help="concurrent calls (env LIPCAST_MAX_SESSIONS)")
    p.add_argument("--backend", choices=BACKENDS, help="lip-sync backend (env LIPCAST_BACKEND)")
    p.add_argument("--checkpoint", type=Path, help="Wav2Lip checkpoint (env LIPCAST_CHECKPOINT)")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (env LIPCAST_DEVICE)")
    p.add_argument("--avatar", help="default avatar name (env LIPCAST_AVATAR)")
    add_repeatable(
        p,
        "--avatar-dir",
        "avatar_dirs",
        "DIR",
        "extra avatar directory, repeatable (env LIPCAST_AVATAR_DIRS, ':'-separated)",
        Path,
    )
    p.add_argument("--fps", type=int, help="output frame rate (env LIPCAST_FPS)")
    p.add_argument(
        "--lookahead-ms",
        type=float,
        help="audio the backend looks ahead per frame (env LIPCAST_LOOKAHEAD_MS)",
    )
    p.add_argument(
        "--jitter-buffer-ms",
        help="inbound audio buffered before playout: a fixed depth in ms (default 60), or 'adaptive' to"
        " follow the observed network jitter from one frame (40 ms) up (env LIPCAST_JITTER_BUFFER_MS)",
    )
    p.add_argument(
        "--render-budget-ms",
        type=float,
        help="time a frame may take to render before it is replaced; without it: derived from the engine's"
        f" measured warm-up time on CUDA, {RENDER_BUDGET_MS:g} ms"
        f" ({CPU_WAV2LIP_RENDER_BUDGET_MS:g} ms for wav2lip) on a CPU (env LIPCAST_RENDER_BUDGET_MS)",
    )
    p.add_argument(
        "--vad-aggressiveness",
        type=int,
        choices=range(4),
        help="webrtcvad mode 0-3 (env LIPCAST_VAD_AGGRESSIVENESS)",
    )
    p.add_argument(
        "--wav2lip-alignment",
        choices=("inference", "training"),
        help="where a frame's 200 ms mel window starts: at the frame (inference, as published) or one frame"
        " earlier (training; 40 ms less latency) (env LIPCAST_WAV2LIP_ALIGNMENT)",
    )
    p.add_argument(
        "--max-session-s",
        type=float,
        help="close a call after this many seconds, 0 for no limit (env LIPCAST_MAX_SESSION_S)",
    )
    p.add_argument(
        "--drain-timeout-s",
        type=float,
        help="on SIGTERM, let live calls go on this long before closing them (env LIPCAST_DRAIN_TIMEOUT_S)",
    )
    add_repeatable(
        p,
        "--cors-origin",
        "cors_origins",
        "ORIGIN",
        "a browser origin (https://host:port) allowed to use the API from another site, "
        "repeatable, '*' for any (env LIPCAST_CORS_ORIGINS, comma-separated)",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        help="torch CPU threads (default: 1 for builtin, all cores for wav2lip on a CPU)"
        " (env LIPCAST_TORCH_THREADS)",
    )
    p.add_argument("--batch-sizes", help="engine batch buckets, e.g. 1,2,4,8 (env LIPCAST_BATCH_SIZES)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (env LIPCAST_LOG_LEVEL)")
    p.add_argument(
        "--upload-dir",
        type=Path,
        metavar="DIR",
        help="where uploaded avatars are prepared; default: the first --avatar-dir (env LIPCAST_UPLOAD_DIR)",
    )
    p.add_argument("--max-upload-mb", type=float, help="largest avatar upload (env LIPCAST_MAX_UPLOAD_MB)")
    p.add_argument(
        "--max-upload-duration-s",
        type=float,
        help="longest avatar video upload (env LIPCAST_MAX_UPLOAD_DURATION_S)",
    )
    p.add_argument(
        "--max-upload-side-px",
        type=int,
        help="largest side of an uploaded video or image (env LIPCAST_MAX_UPLOAD_SIDE_PX)",
    )
    p.add_argument(
        "--avatar-max-side-px",
        type=int,
        help="prepared avatar frames are scaled to at most this a side (env LIPCAST_AVATAR_MAX_SIDE_PX)",
    )
    p.add_argument(
        "--auth-token",
        help="require 'Authorization: Bearer TOKEN' on WHIP, WHEP and /offer (env LIPCAST_AUTH_TOKEN)",
    )
    p.add_argument("--max-viewers", type=int, help="WHEP viewers per session (env LIPCAST_MAX_VIEWERS)")
    p.add_argument(
        "--push-buffer-s",
        type=float,
        help="pushed audio a push session may queue ahead of playout, seconds (env LIPCAST_PUSH_BUFFER_S)",
    )
    p.add_argument(
        "--push-grace-s",
        type=float,
        help="close a push session this long after its audio socket is gone (env LIPCAST_PUSH_GRACE_S)",
    )
    p.add_argument(
        "--viewer-bitrate-kbps",
        type=int,
        help="fixed VP8 bitrate of the viewers' shared encoder (env LIPCAST_VIEWER_BITRATE_KBPS)",
    )
    p.add_argument(
        "--media-workers",
        type=int,
        help="media worker processes (default: cores - 1, 1 with --virtualcam; 1 runs everything in one"
        " process) (env LIPCAST_MEDIA_WORKERS)",
    )
    p.add_argument(
        "--render-in",
        choices=RENDER_PLACES,
        help="with several media workers, render in the front's one engine (shared memory) or in each"
        " worker; auto: workers for the built-in backend on a CPU, else the engine (env LIPCAST_RENDER_IN)",
    )
    p.add_argument(
        "--worker-hang-timeout-s",
        type=float,
        help="restart a media worker that answers no health check this long (env"
        " LIPCAST_WORKER_HANG_TIMEOUT_S)",
    )
    p.add_argument(
        "--virtualcam",
        action="store_true",
        default=None,
        help="send the newest session's video to a virtual camera (needs lipcast[virtualcam]; "
        "env LIPCAST_VIRTUALCAM=1)",
    )
    p.add_argument(
        "--virtualcam-device",
        metavar="PATH",
        help="v4l2loopback device, e.g. /dev/video10 (env LIPCAST_VIRTUALCAM_DEVICE)",
    )
    return p


def _jitter_buffer_ms(raw: str) -> float | None:
    """A fixed depth in milliseconds, or None for ``adaptive``."""
    return None if raw.strip().lower() == "adaptive" else float(raw)


def _flag(raw: str | bool) -> bool:
    if isinstance(raw, bool):
        return raw
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a yes/no value: {raw!r}")


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(ENV_PREFIX + name)
    return value if value not in (None, "") else None


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """Merge parsed flags over environment variables over defaults."""
    env = os.environ if env is None else env
    defaults = Settings()
    converters: dict[str, Any] = {
        "port": int,
        "max_sessions": int,
        "fps": int,
        "vad_aggressiveness": int,
        "lookahead_ms": float,
        "jitter_buffer_ms": _jitter_buffer_ms,
        "render_budget_ms": float,
        "connect_timeout_s": float,
        "max_session_s": float,
        "drain_timeout_s": float,
        "max_viewers": int,
        "push_buffer_s": float,
        "push_grace_s": float,
        "viewer_bitrate_kbps": int,
        "virtualcam": _flag,
        "checkpoint": Path,
        "static_dir": Path,
        "upload_dir": Path,
        "max_upload_mb": float,
        "max_upload_duration_s": float,
        "max_upload_side_px": int,
        "avatar_max_side_px": int,
        "torch_threads": int,
        "media_workers": int,
        "worker_hang_timeout_s": float,
    }
    values: dict[str, Any] = {}
    for f in fields(Settings):
        if f.name in ("ice_servers", "ice_addresses", "avatar_dirs", "batch_sizes", "cors_origins"):
            continue
        flag = getattr(args, f.name, None)
        raw: Any = flag if flag is not None else _env(env, f.name.upper())
        if raw is None:
            continue
        try:
            values[f.name] = converters.get(f.name, str)(raw)
        except ValueError as e:
            raise ValueError(f"invalid {f.name}: {raw!r}") from e

    urls = args.ice_servers or (_env(env, "ICE_SERVERS") or "").split(",")
    username = args.ice_username or _env(env, "ICE_USERNAME")
    credential = args.ice_credential or _env(env, "ICE_CREDENTIAL")
    values["ice_servers"] = _ice_servers(urls, username, credential)
    origins = args.cors_origins or (_env(env, "CORS_ORIGINS") or "").split(",")
    values["cors_origins"] = tuple(o.strip().rstrip("/") for o in origins if o.strip())
    addresses = args.ice_addresses or (_env(env, "ICE_ADDRESSES") or "").split(",")
    values["ice_addresses"] = tuple(a.strip() for a in addresses if a.strip())

    extra_dirs = args.avatar_dirs or [Path(p) for p in (_env(env, "AVATAR_DIRS") or "").split(":") if p]
    values["avatar_dirs"] = (*extra_dirs, *defaults.avatar_dirs)
    if "upload_dir" not in values and extra_dirs:
        values["upload_dir"] = extra_dirs[0]

    if "media_workers" not in values:
        values["media_workers"] = 1 if values.get("virtualcam") else default_media_workers()

    batch = args.batch_sizes or _env(env, "BATCH_SIZES")
    if batch:
        try:
            values["batch_sizes"] = tuple(sorted({int(x) for x in batch.split(",")}))
        except ValueError as e:
            raise ValueError(f"invalid batch sizes: {batch!r}") from e
    return Settings(**values)


def parse_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog="lipcast serve", parents=[build_parser()])
    return settings_from(parser.parse_args(argv), env)
