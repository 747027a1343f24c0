"""The cheaper conversions on the outbound path give what aiortc and swscale gave."""

from __future__ import annotations

import numpy as np
import pytest
from aiortc import rtp
from av import AudioFrame, VideoFrame

from streaming.rtc import AIORTC_AUDIO_LEVEL, _audio_level_dbov, use_fast_audio_level
from streaming.tracks import video_frame


def test_video_frames_leave_as_yuv420p_close_to_swscale() -> None:
    rng = np.random.default_rng(1)
    image = np.zeros((96, 128, 3), np.uint8)
    image[:48] = (200, 40, 30)
    image[48:, 64:] = rng.integers(0, 256, (48, 64, 3))
    frame = video_frame(image)
    assert frame.format.name == "yuv420p" and (frame.width, frame.height) == (128, 96)
    reference = VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p").to_ndarray()
    ours = frame.to_ndarray()
    assert np.abs(ours[:96].astype(int) - reference[:96]).max() <= 1  # luma: the same matrix and range
    back = frame.to_ndarray(format="rgb24").astype(int)
    assert np.abs(back[:48] - image[:48]).max() <= 3  # a flat colour comes back


def test_odd_sizes_and_rgb_consumers_keep_rgb() -> None:
    odd = np.full((15, 20, 3), 90, np.uint8)
    assert video_frame(odd).format.name == "rgb24"
    even = np.full((16, 20, 3), 90, np.uint8)
    frame = video_frame(even, "rgb24")
    assert frame.format.name == "rgb24" and np.array_equal(frame.to_ndarray(), even)


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
