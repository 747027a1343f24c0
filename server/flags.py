"""``lipcast serve``'s flags and ``LIPCAST_*`` environment variables -> one
:class:`~lipcast.server.config.Settings`.

Precedence: flag > environment > default. The environment variable of a field is ``LIPCAST_`` + its name in
capitals; list fields are comma-separated (``LIPCAST_AVATAR_DIRS``: ``:``-separated).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from lipcast.pipeline.defaults import BACKENDS, COMPILE_MODES, CPU_WAV2LIP_RENDER_BUDGET_MS, RENDER_BUDGET_MS
from lipcast.pipeline.enhance.options import FACE_ENHANCE_MODES
from lipcast.server.config import RENDER_PLACES, IceServer, Settings, default_media_workers
from lipcast.streaming.encoders import H264_PRESETS

ENV_PREFIX = "LIPCAST_"
SERVE_BUILTIN_HD_SIZES = "1280x720"  # lipcast serve's default (Settings' is none: tests start faster)


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


# How a field's text, from its flag or its environment variable, becomes its value (the rest stay strings).
CONVERTERS: dict[str, Callable[[str], Any]] = {
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
    "loop_stall_ms": float,
    "max_viewers": int,
    "push_buffer_s": float,
    "push_grace_s": float,
    "viewer_bitrate_kbps": int,
    "vp8_cpu_used": int,
    "vp8_noise_sensitivity": int,
    "virtualcam": _flag,
    "checkpoint": Path,
    "musetalk_weights": Path,
    "musetalk_context_s": float,
    "face_enhance_strength": float,
    "face_enhance_weights": Path,
    "face_enhance_allow_cpu": _flag,
    "compile_cache_dir": Path,
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
# Converted after parsing, not by argparse: "adaptive" becomes None, which must not read as "no flag given".
CONVERTED_AFTER_PARSING = frozenset({"jitter_buffer_ms"})


def _option(p: argparse.ArgumentParser, flag: str, help_text: str, env_note: str = "", **kwargs: Any) -> None:
    """A flag for the field ``dest`` (from the flag's name unless given): converted by the field's converter,
    its help naming the field's environment variable (``env_note`` adds how a list is written there)."""
    dest = kwargs.setdefault("dest", flag.removeprefix("--").replace("-", "_"))
    if dest in CONVERTERS and dest not in CONVERTED_AFTER_PARSING and "action" not in kwargs:
        kwargs.setdefault("type", CONVERTERS[dest])
    p.add_argument(flag, help=f"{help_text} (env {ENV_PREFIX}{dest.upper()}{env_note})", **kwargs)


def _list_option(
    p: argparse.ArgumentParser,
    flag: str,
    metavar: str,
    help_text: str,
    env_note: str = ", comma-separated",
    **kwargs: Any,
) -> None:
    """A repeatable flag; its values collect in a list under the plural of its name (``--ice-address``:
    ``ice_addresses``)."""
    name = flag.removeprefix("--").replace("-", "_")
    dest = name + ("es" if name.endswith("s") else "s")
    _option(p, flag, help_text, env_note, action="append", metavar=metavar, dest=dest, **kwargs)


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
    _option(p, "--host", "address to listen on")
    _option(p, "--port", "HTTP port")
    _list_option(p, "--ice-server", "URL", "STUN/TURN URL, repeatable")
    _list_option(
        p, "--ice-address", "ADDR", "offer only this local address as an ICE host candidate, repeatable"
    )
    _option(p, "--ice-username", "TURN username")
    _option(p, "--ice-credential", "TURN credential")
    _option(p, "--max-sessions", "concurrent calls")
    _option(p, "--backend", "lip-sync backend", choices=BACKENDS)
    _option(p, "--checkpoint", "Wav2Lip checkpoint")
    _option(p, "--device", "auto, cpu, cuda or cuda:N")
    _option(p, "--gpus", "one engine per listed GPU, e.g. 0,1 (default with cuda or auto: every GPU)")
    _option(p, "--avatar", "default avatar name")
    _list_option(p, "--avatar-dir", "DIR", "extra avatar directory, repeatable", ", ':'-separated", type=Path)
    _option(p, "--fps", "output frame rate")
    _option(p, "--lookahead-ms", "audio the backend looks ahead per frame")
    _option(
        p,
        "--jitter-buffer-ms",
        "inbound audio buffered before playout: 'adaptive' (default) follows the observed network jitter"
        " from one frame (40 ms) up; a number is a fixed depth in ms",
    )
    _option(
        p,
        "--render-budget-ms",
        "time a frame may take to render before it is replaced; without it: derived from the engine's"
        f" measured warm-up time on CUDA, {RENDER_BUDGET_MS:g} ms"
        f" ({CPU_WAV2LIP_RENDER_BUDGET_MS:g} ms for wav2lip) on a CPU",
    )
    _option(p, "--vad-aggressiveness", "webrtcvad mode 0-3", choices=range(4))
    _option(
        p,
        "--wav2lip-alignment",
        "where a frame's 200 ms mel window starts: at the frame (inference, as published) or one frame "
        "earlier (training; 40 ms less latency)",
        choices=("inference", "training"),
    )
    _option(
        p,
        "--wav2lip-compile",
        "torch.compile Wav2Lip's kernels per batch size: auto (default) uses them on CUDA when `lipcast"
        " engine build` has built them, on also builds them at start, off never; a CPU renders eager",
        choices=("auto", "on", "off"),
    )
    _option(
        p,
        "--wav2lip-compile-mode",
        "torch.compile mode: default (fusion, no autotuning) or max-autotune-no-cudagraphs (autotunes every"
        " convolution; builds far longer)",
        choices=COMPILE_MODES,
    )
    _option(p, "--musetalk-weights", "MuseTalk 1.5 weights directory (docs/musetalk.md)", metavar="DIR")
    _option(p, "--musetalk-context-s", "seconds of past audio in MuseTalk's whisper input (1-30)")
    _option(
        p,
        "--musetalk-floor",
        "MuseTalk's log-mel floor: running (the loudest since the call began), input (the reference's, over"
        " the current input) or a number (a fixed maximum)",
    )
    _option(
        p,
        "--musetalk-decode",
        "MuseTalk's VAE decodes the rows the blend mask uses (rows) or the whole face (full)",
        choices=("rows", "full"),
    )
    _option(
        p,
        "--musetalk-compile",
        "torch.compile MuseTalk's UNet and decode per batch size: auto (default) uses them on CUDA when a"
        " start with `on` has built them into the compile cache, on also builds them at start (minutes the"
        " first time), off never",
        choices=("auto", "on", "off"),
    )
    _option(
        p,
        "--face-enhance",
        "face post-processing of a session that asks for none: off (default) or sharpen (a restorer on the"
        " mouth; needs --face-enhance-weights; docs/sharpen.md)",
        choices=FACE_ENHANCE_MODES,
    )
    _option(p, "--face-enhance-strength", "default sharpen strength in [0, 1] (0.7)")
    _option(
        p,
        "--face-enhance-weights",
        "restorer weights for sharpen, loaded with spandrel (lipcast[enhance]): realesr-general-x4v3.pth",
        metavar="FILE",
    )
    p.add_argument(
        "--face-enhance-allow-cpu",
        action="store_true",
        default=None,
        help="allow sharpen on a CPU-only server (refused there by default: too slow for a live call;"
        " env LIPCAST_FACE_ENHANCE_ALLOW_CPU=1)",
    )
    _option(
        p,
        "--compile-cache-dir",
        "where compiled kernels are kept (default ~/.cache/lipcast/compile; `lipcast engine build` fills it)",
        metavar="DIR",
    )
    _option(p, "--max-session-s", "close a call after this many seconds, 0 for no limit")
    _option(p, "--drain-timeout-s", "on SIGTERM, let live calls go on this long before closing them")
    _option(
        p,
        "--loop-stall-ms",
        "log an event-loop stall (no callback ran) longer than this, with the stack it was in; 0: off",
    )
    _list_option(
        p,
        "--cors-origin",
        "ORIGIN",
        "a browser origin (https://host:port) allowed to use the API from another site, repeatable, '*' for"
        " any",
    )
    _option(
        p, "--torch-threads", "torch CPU threads (default: 1 for builtin, all cores for wav2lip on a CPU)"
    )
    _option(p, "--batch-sizes", "engine batch buckets, e.g. 1,2,4,8")
    _option(p, "--log-level", "DEBUG, INFO, WARNING")
    _option(
        p,
        "--upload-dir",
        "where uploaded avatars are prepared; default: the first --avatar-dir",
        metavar="DIR",
    )
    _option(p, "--max-upload-mb", "largest avatar upload")
    _option(p, "--max-upload-duration-s", "longest avatar video upload")
    _option(p, "--max-upload-side-px", "largest side of an uploaded video or image")
    _option(p, "--avatar-max-side-px", "prepared avatar frames are scaled to at most this a side")
    _option(p, "--auth-token", "require 'Authorization: Bearer TOKEN' on WHIP, WHEP and /offer")
    _option(p, "--max-viewers", "WHEP viewers per session")
    _option(p, "--push-buffer-s", "pushed audio a push session may queue ahead of playout, seconds")
    _option(p, "--push-grace-s", "close a push session this long after its audio socket is gone")
    _option(p, "--viewer-bitrate-kbps", "fixed VP8 bitrate of the viewers' shared encoder")
    _option(
        p,
        "--vp8-cpu-used",
        "libvpx speed of the VP8 encoders, -16..16 (aiortc's -6; a larger magnitude encodes faster, worse)",
    )
    _option(
        p,
        "--vp8-noise-sensitivity",
        "libvpx temporal denoiser of the VP8 encoders, 0 (off, for rendered pictures) .. 6 (aiortc: 4)",
    )
    _option(
        p,
        "--max-output-size",
        "the largest video size a call or viewer may ask for (WIDTHxHEIGHT, either orientation; at most "
        "1920x1080)",
    )
    _option(
        p,
        "--video-codecs",
        "video codecs in the server's order of preference, among those an offer lists (vp8, h264)",
    )
    _option(p, "--h264-preset", "x264 preset of the H.264 encoders", choices=H264_PRESETS)
    _option(
        p,
        "--builtin-hd-sizes",
        "the built-in avatar also at these sizes, comma-separated WIDTHxHEIGHT (1280x720 is "
        "astronaut-720p; a second or two of start-up each; empty: none)",
    )
    _option(
        p,
        "--media-workers",
        "media worker processes (default: cores - 1, 1 with --virtualcam; 1 runs everything in one process)",
    )
    _option(
        p,
        "--render-in",
        "with several media workers, render in the front's one engine (shared memory) or in each worker; "
        "auto: workers for the built-in backend on a CPU, else the engine",
        choices=RENDER_PLACES,
    )
    _option(p, "--worker-hang-timeout-s", "restart a media worker that answers no health check this long")
    p.add_argument(
        "--virtualcam",
        action="store_true",
        default=None,
        help="send the newest session's video to a virtual camera (needs lipcast[virtualcam]; "
        "env LIPCAST_VIRTUALCAM=1)",
    )
    _option(p, "--virtualcam-device", "v4l2loopback device, e.g. /dev/video10", metavar="PATH")
    return p


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(ENV_PREFIX + name)
    return value if value not in (None, "") else None


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """Merge parsed flags over environment variables over defaults."""
    env = os.environ if env is None else env
    defaults = Settings()
    values: dict[str, Any] = {}
    for f in fields(Settings):
        if f.name in ("ice_servers", "ice_addresses", "avatar_dirs", "batch_sizes", "cors_origins", "gpus"):
            continue
        flag = getattr(args, f.name, None)
        raw: Any = flag if flag is not None else _env(env, f.name.upper())
        if raw is None:
            continue
        try:
            values[f.name] = CONVERTERS.get(f.name, str)(raw)
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

    if "builtin_hd_sizes" not in values:
        values["builtin_hd_sizes"] = SERVE_BUILTIN_HD_SIZES
    if "media_workers" not in values:
        values["media_workers"] = 1 if values.get("virtualcam") else default_media_workers()

    gpus = args.gpus or _env(env, "GPUS")
    if gpus:
        values["gpus"] = tuple(g.strip() for g in gpus.split(",") if g.strip())
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
