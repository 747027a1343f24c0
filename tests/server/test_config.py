from __future__ import annotations

from pathlib import Path

import pytest

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR
from lipcast.server.config import Settings
from lipcast.server.flags import parse_settings


def test_defaults_serve_the_builtin_avatar_on_loopback() -> None:
    s = parse_settings([], env={})
    assert (s.host, s.port, s.backend, s.avatar) == ("127.0.0.1", 8080, "builtin", "astronaut")
    assert s.ice_servers == ()
    assert s.avatar_dirs == (BUILTIN_AVATAR_DIR,)


def test_flags_beat_environment_beats_defaults() -> None:
    env = {"LIPCAST_PORT": "9000", "LIPCAST_MAX_SESSIONS": "7", "LIPCAST_JITTER_BUFFER_MS": "30"}
    s = parse_settings(["--port", "9100"], env=env)
    assert s.port == 9100 and s.max_sessions == 7 and s.jitter_buffer_ms == 30.0


def test_ice_servers_from_flags_and_env() -> None:
    s = parse_settings(
        [
            "--ice-server",
            "stun:stun.example.org:3478",
            "--ice-server",
            "turn:turn.example.org:3478",
            "--ice-username",
            "u",
            "--ice-credential",
            "p",
        ],
        env={},
    )
    assert [x.to_json() for x in s.ice_servers] == [
        {"urls": ["stun:stun.example.org:3478"]},
        {"urls": ["turn:turn.example.org:3478"], "username": "u", "credential": "p"},
    ]
    env = {"LIPCAST_ICE_SERVERS": "stun:a:1,stun:b:2"}
    assert len(parse_settings([], env=env).ice_servers) == 2


def test_avatar_dirs_and_batch_sizes() -> None:
    s = parse_settings(["--avatar-dir", "/tmp/a", "--batch-sizes", "4,1,2,2"], env={})
    assert s.avatar_dirs == (Path("/tmp/a"), BUILTIN_AVATAR_DIR)
    assert s.batch_sizes == (1, 2, 4)


def test_gpus_list() -> None:
    assert parse_settings(["--gpus", "0, 1"], env={}).gpus == ("0", "1")
    assert parse_settings([], env={"LIPCAST_GPUS": "cuda:1,cuda:2"}).gpus == ("cuda:1", "cuda:2")
    assert parse_settings([], env={}).gpus == ()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"port": 0}, "port"),
        ({"backend": "wav2lip"}, "checkpoint"),
        ({"backend": "nope"}, "backend"),
        ({"max_sessions": 0}, "max_sessions"),
        ({"vad_aggressiveness": 5}, "vad"),
        ({"vp8_cpu_used": 20}, "cpu-used"),
        ({"vp8_noise_sensitivity": -1}, "noise sensitivity"),
    ],
)
def test_invalid_settings_are_refused_with_a_reason(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**changes)


def test_bad_ice_url_is_refused() -> None:
    with pytest.raises(ValueError, match="ICE server URL"):
        parse_settings(["--ice-server", "http://x"], env={})


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Settings().port = 1  # type: ignore[misc]


def test_jitter_buffer_is_fixed_by_default_and_adaptive_on_request() -> None:
    assert parse_settings([], env={}).jitter_buffer_ms is None  # adaptive
    assert parse_settings(["--jitter-buffer-ms", "60"], env={}).jitter_buffer_ms == 60.0
    assert parse_settings(["--jitter-buffer-ms", "adaptive"], env={}).jitter_buffer_ms is None
    assert parse_settings([], env={"LIPCAST_JITTER_BUFFER_MS": "adaptive"}).jitter_buffer_ms is None


def test_vp8_settings_default_to_aiortcs_speed_without_the_denoiser() -> None:
    s = parse_settings([], env={})
    assert (s.vp8().cpu_used, s.vp8().noise_sensitivity) == (-6, 0)
    s = parse_settings(["--vp8-cpu-used", "-12"], env={"LIPCAST_VP8_NOISE_SENSITIVITY": "4"})
    assert (s.vp8().cpu_used, s.vp8().noise_sensitivity) == (-12, 4)
