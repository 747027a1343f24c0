"""One frozen settings object: the fields, their defaults and their validation.

It is built once from command-line flags and ``LIPCAST_*`` environment variables
(:mod:`lipcast.server.flags`). Every component gets the settings (or the part it needs) through its
constructor; nothing reads the environment anywhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, DEFAULT_AVATAR
from lipcast.pipeline.defaults import (
    BACKENDS,
    COMPILE_MODE,
    COMPILE_MODES,
    DEFAULT_BACKEND,
    MUSETALK,
    WAV2LIP,
)
from lipcast.pipeline.enhance.options import (
    DEFAULT_STRENGTH,
    FACE_ENHANCE_MODES,
    OFF,
    SHARPEN,
    EnhanceChoice,
)
from lipcast.pipeline.render_config import RenderConfig
from lipcast.pipeline.timing import FPS
from lipcast.streaming.encoders import (
    AIORTC_CPU_USED,
    DEFAULT_H264_PRESET,
    DEFAULT_NOISE_SENSITIVITY,
    VIDEO_CODECS,
    H264Settings,
    Vp8Settings,
)
from lipcast.streaming.loop_stalls import DEFAULT_BEAT_MS as LOOP_BEAT_MS
from lipcast.streaming.sizes import DEFAULT_MAX_OUTPUT_SIZE, OutputSize, SizeError

# The call and viewer pages ship inside the package (the wheel too), found through it wherever it is.
STATIC_DIR = Path(str(resources.files("lipcast") / "static"))
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
    gpus: tuple[str, ...] = ()  # one engine each ("0", "1", or device strings); empty: from `device`
    avatar: str = DEFAULT_AVATAR
    avatar_dirs: tuple[Path, ...] = (BUILTIN_AVATAR_DIR,)
    fps: int = FPS
    lookahead_ms: float | None = None  # None: the backend's default
    wav2lip_alignment: str = "inference"  # "inference" (published) or "training" (one frame earlier)
    # torch.compile of Wav2Lip's network per bucket: auto = on CUDA with Triton when a build exists, off on
    # a CPU; on = also build at start
    wav2lip_compile: str = "auto"
    compile_cache_dir: Path | None = None  # None: ~/.cache/lipcast/compile
    wav2lip_compile_mode: str = COMPILE_MODE  # one of COMPILE_MODES
    # MuseTalk (lipcast[musetalk]; docs/musetalk.md): the weights directory, the encoder's context of past
    # audio, the log-mel floor policy, and whether the VAE decodes only the rows the blend mask uses
    musetalk_weights: Path | None = None
    musetalk_context_s: float = 30.0
    musetalk_floor: str = "running"
    musetalk_decode: str = "rows"
    # torch.compile of MuseTalk's UNet and row decode per bucket, as --wav2lip-compile (auto: when built)
    musetalk_compile: str = "auto"
    # Face post-processing (lipcast[enhance]; docs/sharpen.md): the default mode of a session that names
    # none, its default strength, the restorer weights file, and whether sharpen may run on a CPU
    face_enhance: str = OFF
    face_enhance_strength: float = DEFAULT_STRENGTH
    face_enhance_weights: Path | None = None
    face_enhance_allow_cpu: bool = False
    # None ("adaptive", the default): from one frame up, following the observed jitter; a number: fixed ms
    jitter_buffer_ms: float | None = None
    render_budget_ms: float | None = None  # None: from the warm-up timings on CUDA; 40 ms (400 ms for
    # wav2lip) on a CPU
    vad_aggressiveness: int = 2
    torch_threads: int | None = None  # None: 1 for the built-in backend, every core for wav2lip on a CPU
    batch_sizes: tuple[int, ...] = ()  # empty: 1..128 on CUDA, 1..8 on a CPU
    connect_timeout_s: float = 30.0
    max_session_s: float = 3600.0  # a call is closed after this long (0: no limit)
    drain_timeout_s: float = 30.0  # on SIGTERM: how long live calls may go on before they are closed
    loop_stall_ms: float = 100.0  # log an event-loop stall longer than this, with where it was (0: off)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API from other sites ("*": any)
    auth_token: str | None = field(default=None, repr=False)  # Bearer token for WHIP, WHEP and /offer
    max_viewers: int = 8  # WHEP viewers per session
    push_buffer_s: float = 30.0  # pushed audio a push session queues ahead of playout (POST /sessions)
    push_grace_s: float = 30.0  # a push session without an audio socket for this long is closed
    viewer_bitrate_kbps: int = 1500  # the shared viewer encoder's fixed VP8 target
    # VP8 (the caller's and the viewers' encoders): libvpx's speed (aiortc's -6; -16..16, a larger magnitude
    # is faster) and its temporal denoiser (0 off, aiortc's 4 is for cameras); see streaming/encoders.py
    vp8_cpu_used: int = AIORTC_CPU_USED
    vp8_noise_sensitivity: int = DEFAULT_NOISE_SENSITIVITY
    # Video size and codec per session (streaming/sizes.py, streaming/encoders.py): the largest output size a
    # call or viewer may ask for; the video codecs, in the server's order of preference, among those an offer
    # lists (vp8, h264); x264's preset for H.264 (constrained baseline, zerolatency, one thread a call)
    max_output_size: str = DEFAULT_MAX_OUTPUT_SIZE
    video_codecs: str = ",".join(VIDEO_CODECS)
    h264_preset: str = DEFAULT_H264_PRESET
    # The built-in avatar at these sizes too (comma-separated WIDTHxHEIGHT; made at start, a second or two
    # each): "astronaut-720p" for 1280x720. ``lipcast serve`` defaults to 1280x720.
    builtin_hd_sizes: str = ""
    virtualcam: bool = False
    virtualcam_device: str | None = None  # None: the first v4l2loopback device
    static_dir: Path = STATIC_DIR
    log_level: str = "INFO"
    # Avatar uploads (POST /avatars): where prepared avatars go (None: the first --avatar-dir, else no
    # uploads), and what an upload may be.
    upload_dir: Path | None = None
    max_upload_mb: float = 50.0
    max_upload_duration_s: float = 30.0
    max_upload_side_px: int = 1920
    avatar_max_side_px: int = 1920  # frames of prepared avatars are scaled to at most this a side
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
        if self.backend == MUSETALK and self.musetalk_weights is None:
            problems.append("--backend musetalk needs --musetalk-weights DIR (the project ships no weights)")
        if self.musetalk_decode not in ("rows", "full"):
            problems.append("musetalk_decode must be rows or full")
        if self.face_enhance not in FACE_ENHANCE_MODES:
            problems.append(f"face_enhance must be one of {', '.join(FACE_ENHANCE_MODES)}")
        if not 0.0 <= self.face_enhance_strength <= 1.0:
            problems.append("face_enhance_strength must be in [0, 1]")
        if self.face_enhance == SHARPEN and self.face_enhance_weights is None:
            problems.append(
                "--face-enhance sharpen needs --face-enhance-weights FILE (a restorer, docs/sharpen.md)"
            )
        if self.face_enhance_weights is not None and self.backend != WAV2LIP:
            problems.append("--face-enhance-weights works with --backend wav2lip only")
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
        if self.wav2lip_compile not in ("auto", "on", "off"):
            problems.append("wav2lip_compile must be auto, on or off")
        if self.musetalk_compile not in ("auto", "on", "off"):
            problems.append("musetalk_compile must be auto, on or off")
        if self.wav2lip_compile_mode not in COMPILE_MODES:
            problems.append("wav2lip_compile_mode must be max-autotune-no-cudagraphs or default")
        if self.batch_sizes and min(self.batch_sizes) < 1:
            problems.append("batch sizes must be positive")
        if self.max_upload_mb <= 0 or self.max_upload_duration_s <= 0:
            problems.append("max_upload_mb and max_upload_duration_s must be positive")
        if self.max_upload_side_px < 16 or self.avatar_max_side_px < 16:
            problems.append("max_upload_side_px and avatar_max_side_px must be at least 16")
        if self.max_session_s < 0 or self.drain_timeout_s < 0:
            problems.append("max_session_s and drain_timeout_s must be >= 0")
        if self.loop_stall_ms != 0 and self.loop_stall_ms <= LOOP_BEAT_MS:
            problems.append(f"loop_stall_ms must be 0 (off) or more than {LOOP_BEAT_MS:g}")
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
        for check in (self.vp8, self.h264, self.output_cap, self.codec_preference, self.hd_sizes):
            try:
                check()
            except ValueError as e:
                problems.append(str(e))
        if self.auth_token is not None and not self.auth_token.strip():
            problems.append("auth_token must not be blank")
        if problems:
            raise ValueError("; ".join(problems))

    def enhance_default(self) -> EnhanceChoice:
        """What a session that names no face post-processing gets."""
        return EnhanceChoice(self.face_enhance, self.face_enhance_strength)

    def vp8(self) -> Vp8Settings:
        return Vp8Settings(self.vp8_cpu_used, self.vp8_noise_sensitivity)

    def h264(self) -> H264Settings:
        return H264Settings(self.h264_preset)

    def output_cap(self) -> OutputSize:
        try:
            return OutputSize.parse(self.max_output_size, "max_output_size")
        except SizeError as e:
            raise ValueError(str(e)) from None

    def codec_preference(self) -> tuple[str, ...]:
        names = tuple(c.strip().lower() for c in self.video_codecs.split(",") if c.strip())
        unknown = [c for c in names if c not in VIDEO_CODECS]
        if unknown or not names or len(set(names)) != len(names):
            raise ValueError(f"video_codecs must list some of {', '.join(VIDEO_CODECS)} once each")
        return names

    def hd_sizes(self) -> tuple[OutputSize, ...]:
        try:
            sizes = tuple(
                OutputSize.parse(t, "builtin_hd_sizes") for t in self.builtin_hd_sizes.split(",") if t.strip()
            )
        except SizeError as e:
            raise ValueError(str(e)) from None
        return sizes

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    def avatar_search_path(self) -> tuple[Path, ...]:
        """Where avatars are looked for: the upload directory first (avatars users prepared), then the
        rest."""
        dirs = self.avatar_dirs
        if self.upload_dir is not None and self.upload_dir not in dirs:
            dirs = (self.upload_dir, *dirs)
        return dirs

    def render_config(self) -> RenderConfig:
        """What the render side is built from (:func:`lipcast.pipeline.assembly.assemble`)."""
        return RenderConfig(
            backend=self.backend,
            device=self.device,
            gpus=self.gpus,
            checkpoint=self.checkpoint,
            lookahead_ms=self.lookahead_ms,
            batch_sizes=self.batch_sizes,
            render_budget_ms=self.render_budget_ms,
            max_sessions=self.max_sessions,
            torch_threads=self.torch_threads,
            wav2lip_alignment=self.wav2lip_alignment,
            wav2lip_compile=self.wav2lip_compile,
            wav2lip_compile_mode=self.wav2lip_compile_mode,
            musetalk_weights=self.musetalk_weights,
            musetalk_context_s=self.musetalk_context_s,
            musetalk_floor=self.musetalk_floor,
            musetalk_decode=self.musetalk_decode,
            musetalk_compile=self.musetalk_compile,
            face_enhance_weights=self.face_enhance_weights,
            compile_cache_dir=self.compile_cache_dir,
            avatar_dirs=self.avatar_search_path(),
            default_avatar=self.avatar,
            builtin_hd_sizes=tuple((s.width, s.height) for s in self.hd_sizes()),
        )
