"""The cheaper audio level computation on the outbound path gives aiortc's figure."""

from __future__ import annotations

import numpy as np
import pytest
from aiortc import rtp
from av import AudioFrame

from lipcast.streaming.rtc import AIORTC_AUDIO_LEVEL, _audio_level_dbov, use_fast_audio_level


@pytest.mark.parametrize("layout, channels", [("mono", 1), ("stereo", 2)])
def test_audio_level_is_aiortcs_figure(layout: str, channels: int) -> None:
    original = AIORTC_AUDIO_LEVEL
    assert original is not _audio_level_dbov
    rng = np.random.default_rng(2)
    for scale in (0.0, 1.0, 10.0, 300.0, 3000.0, 40000.0):
        samples = np.clip(rng.normal(0.0, scale, (1, 960 * channels)), -32768, 32767).astype(np.int16)
        frame = AudioFrame.from_ndarray(samples, format="s16", layout=layout)
        assert _audio_level_dbov(frame) == original(frame), scale


def test_use_fast_audio_level_replaces_aiortcs_once() -> None:
    original = rtp.compute_audio_level_dbov
    try:
        use_fast_audio_level()
        use_fast_audio_level()
        assert rtp.compute_audio_level_dbov is _audio_level_dbov
    finally:
        rtp.compute_audio_level_dbov = original
