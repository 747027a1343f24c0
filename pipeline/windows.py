"""Fixed audio windows on the video frame grid.

The session's audio is a 16 kHz mono stream cut into hops of one video frame (40 ms at 25 fps). Video frame
``i`` owns the audio ``[i * hop, (i + 1) * hop)``. A backend looks ``lookahead`` samples further before it can
condition frame ``i``, so frame ``i`` can be produced once audio up to ``(i + 1) * hop + lookahead`` exists;
the outgoing audio is delayed by ``lookahead`` so that it leaves together with its frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lipcast.pipeline.timing import FEATURE_SAMPLE_RATE_HZ, FPS


@dataclass(frozen=True)
class FrameGrid:
    """Sample arithmetic for one frame rate."""

    fps: int = FPS
    sample_rate_hz: int = FEATURE_SAMPLE_RATE_HZ

    def __post_init__(self) -> None:
        if self.fps <= 0 or self.sample_rate_hz % self.fps != 0:
            raise ValueError(f"fps {self.fps} must divide the sample rate {self.sample_rate_hz} Hz exactly")

    @property
    def samples_per_frame(self) -> int:
        """Samples in one video frame's hop (640 at 16 kHz and 25 fps)."""
        return self.sample_rate_hz // self.fps

    @property
    def frame_ms(self) -> float:
        return 1000.0 / self.fps

    def ms_to_samples(self, duration_ms: float) -> int:
        """Whole samples covering ``duration_ms`` (rounded up, so a lookahead is never short)."""
        return math.ceil(round(duration_ms * self.sample_rate_hz / 1000.0, 6))

    def samples_to_ms(self, samples: int) -> float:
        return samples * 1000.0 / self.sample_rate_hz

    def frame_span(self, frame_index: int) -> tuple[int, int]:
        """The ``[start, end)`` samples of a frame's own audio."""
        start = frame_index * self.samples_per_frame
        return start, start + self.samples_per_frame
