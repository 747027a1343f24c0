"""The startup pass through a call's media code: it runs every codec end to end, off the loop."""

from __future__ import annotations

import pytest

from lipcast.streaming.codec_warmup import _warm_audio, warm_media_path
from lipcast.streaming.encoders import Vp8Settings


def test_the_opus_round_trip_returns_the_audio_it_was_given() -> None:
    # Three 20 ms frames in; Opus may hold back its look-ahead, but most of it comes back out.
    assert 2 * 960 <= _warm_audio() <= 3 * 960


def test_the_whole_pass_runs_at_the_avatar_size_with_the_servers_vp8_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO")
    assert warm_media_path(176, 144, Vp8Settings()) > 0
    assert "media path warmed" in caplog.text and "176x144" in caplog.text
