"""One frozen settings object, built once from command-line flags and ``LIPCAST_*`` environment variables.

Precedence: flag > environment > default. Every component gets the settings (or the part it needs) through
its constructor; nothing reads the environment anywhere else.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pipeline.avatar import BUILTIN_AVATAR_DIR, DEFAULT_AVATAR
from pipeline.defaults import (
    BACKENDS,
    CPU_WAV2LIP_RENDER_BUDGET_MS,
    DEFAULT_BACKEND,
    RENDER_BUDGET_MS,
    WAV2LIP,
)
from pipeline.timing import FPS

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "LIPCAST_"
RENDER_PLACES = ("auto", "engine", "worker")


def default_media_workers() -> int:
    """``lipcast serve``'s default: one media worker per core but one (the front and the engine), >= 1."""
    return max(1, (os.cpu_count() or 1) - 1)


@dataclass(frozen=True)
class IceServer:
    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"urls": list(self.urls)}
        if self.username is not None:
            out["username"] = self.username
        if self.credential is not None:
            out["credential"] = self.credential
        return out


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    ice_servers: tuple[IceServer, ...] = ()
    ice_addresses: tuple[str, ...] = ()  # empty: every interface's addresses
    max_sessions: int = 4
    backend: str = DEFAULT_BACKEND
    checkpoint: Path | None = None
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    avatar: str = DEFAULT_AVATAR
    avatar_dirs: tuple[Path, ...] = (BUILTIN_AVATAR_DIR,)
    fps: int = FPS
    lookahead_ms: float | None = None  # None: the backend's default
    wav2lip_alignment: str = "inference"  # "inference" (published) or "training" (one frame earlier)
    # None ("adaptive"): from one frame up, following the observed jitter. Fixed by default: under CPU load
    # the adaptive buffer, starting small, ran dry inside speech far more often (see README).
    jitter_buffer_ms: float | None = 60.0
    render_budget_ms: float | None = None  # None: from the warm-up timings on CUDA; 40 ms (400 ms for
    # wav2lip) on a CPU
    vad_aggressiveness: int = 2
    torch_threads: int | None = None  # None: 1 for the built-in backend, every core for wav2lip on a CPU
    batch_sizes: tuple[int, ...] = ()  # empty: 1..128 on CUDA, 1..8 on a CPU
    connect_timeout_s: float = 30.0
    max_session_s: float = 3600.0  # a call is closed after this long (0: no limit)
    drain_timeout_s: float = 30.0  # on SIGTERM: how long live calls may go on before they are closed
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API from other sites ("*": any)
    auth_token: str | None = field(default=None, repr=False)  # Bearer token for WHIP, WHEP and /offer
    max_viewers: int = 8  # WHEP viewers per session
    push_buffer_s: float = 30.0  # pushed audio a push session queues ahead of playout (POST /sessions)
    push_grace_s: float = 30.0  # a push session without an audio socket for this long is closed
    viewer_bitrate_kbps: int = 1500  # the shared viewer encoder's fixed VP8 target
    virtualcam: bool = False
    virtualcam_device: str | None = None  # None: the first v4l2loopback device
    static_dir: Path = field(default=PROJECT_ROOT / "static")
    log_level: str = "INFO"
    # Avatar uploads (POST /avatars): where prepared avatars go (None: the first --avatar-dir, else no
    # uploads), and what an upload may be.
    upload_dir: Path | None = None
    max_upload_mb: float = 50.0
    max_upload_duration_s: float = 30.0
    max_upload_side_px: int = 1920
    avatar_max_side_px: int = 640  # frames of prepared avatars are scaled to at most this a side
    # Media workers (server/front, server/worker): 1 runs everything in one process, as before; N > 1 runs a
    # front process and N worker processes. ``lipcast serve`` defaults to cores - 1 (default_media_workers).
    media_workers: int = 1
    # Where frames are rendered with several workers: "engine" (the front's one engine, through shared
    # memory), "worker" (a CPU engine in each worker), "auto" (worker for the built-in backend on a CPU).
    render_in: str = "auto"
    worker_hang_timeout_s: float = 10.0  # a worker that answers no health check this long is restarted

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.port < 65536:
            problems.append(f"port {self.port} out of range")
        if self.max_sessions < 1:
            problems.append("max_sessions must be at least 1")
        if self.backend not in BACKENDS:
            problems.append(f"backend must be one of {', '.join(BACKENDS)}")
        if self.backend == WAV2LIP and self.checkpoint is None:
            problems.append("--backend wav2lip needs --checkpoint PATH (the project ships no weights)")
        if self.fps != FPS:
            problems.append(f"fps must be {FPS} (the lip-sync models' frame rate)")
        if not 0 <= self.vad_aggressiveness <= 3:
            problems.append("vad_aggressiveness must be 0..3")
        if (self.jitter_buffer_ms is not None and self.jitter_buffer_ms <= 0) or (
            self.render_budget_ms is not None and self.render_budget_ms <= 0
        ):
            problems.append("jitter_buffer_ms and render_budget_ms must be > 0")
        if self.lookahead_ms is not None and self.lookahead_ms < 0:
            problems.append("lookahead_ms must be >= 0")
        if self.wav2lip_alignment not in ("inference", "training"):
            problems.append("wav2lip_alignment must be 'inference' or 'training'")
        if self.batch_sizes and min(self.batch_sizes) < 1:
            problems.append("batch sizes must be positive")
        if self.max_upload_mb <= 0 or self.max_upload_duration_s <= 0:
            problems.append("max_upload_mb and max_upload_duration_s must be positive")
        if self.max_upload_side_px < 16 or self.avatar_max_side_px < 16:
            problems.append("max_upload_side_px and avatar_max_side_px must be at least 16")
        if self.max_session_s < 0 or self.drain_timeout_s < 0:
            problems.append("max_session_s and drain_timeout_s must be >= 0")
        if self.push_buffer_s <= 0 or self.push_grace_s <= 0:
            problems.append("push_buffer_s and push_grace_s must be > 0")
        if self.media_workers < 1:
            problems.append("media_workers must be at least 1")
        if self.render_in not in RENDER_PLACES:
            problems.append(f"render_in must be one of {', '.join(RENDER_PLACES)}")
        if self.worker_hang_timeout_s <= 0:
            problems.append("worker_hang_timeout_s must be positive")
        if self.media_workers > 1 and self.virtualcam:
            problems.append("--virtualcam needs --media-workers 1 (the camera follows one process's calls)")
        if self.max_viewers < 0:
            problems.append("max_viewers must be >= 0")
        if not 100 <= self.viewer_bitrate_kbps <= 20_000:
            problems.append("viewer_bitrate_kbps must be 100..20000")
        if self.auth_token is not None and not self.auth_token.strip():
            problems.append("auth_token must not be blank")
        if problems:
            raise ValueError("; ".join(problems))

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **changes)


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
    p.add_argument(
        "--ice-server",
        action="append",
        dest="ice_servers",
        metavar="URL",
        help="STUN/TURN URL, repeatable (env LIPCAST_ICE_SERVERS, comma-separated)",
    )
    p.add_argument(
        "--ice-address",
        action="append",
        dest="ice_addresses",
        metavar="ADDR",
        help="offer only this local address as an ICE host candidate, repeatable "
        "(env LIPCAST_ICE_ADDRESSES, comma-separated)",
    )
    p.add_argument("--ice-username", help="TURN username (env LIPCAST_ICE_USERNAME)")
    p.add_argument("--ice-credential", help="TURN credential (env LIPCAST_ICE_CREDENTIAL)")
    p.add_argument("--max-sessions", type=int, help="concurrent calls (env LIPCAST_MAX_SESSIONS)")
    p.add_argument("--backend", choices=BACKENDS, help="lip-sync backend (env LIPCAST_BACKEND)")
    p.add_argument("--checkpoint", type=Path, help="Wav2Lip checkpoint (env LIPCAST_CHECKPOINT)")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (env LIPCAST_DEVICE)")
    p.add_argument("--avatar", help="default avatar name (env LIPCAST_AVATAR)")
    p.add_argument(
        "--avatar-dir",
        action="append",
        dest="avatar_dirs",
        type=Path,
        metavar="DIR",
        help="extra avatar directory, repeatable (env LIPCAST_AVATAR_DIRS, ':'-separated)",
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
    p.add_argument(
        "--cors-origin",
        action="append",
        dest="cors_origins",
        metavar="ORIGIN",
        help="a browser origin (https://host:port) allowed to use the API from another site, "
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
