"""One tick of a session's media clock: the frame and the audio that leave together.

:class:`~lipcast.streaming.avatar_stream.AvatarStream` produces ticks; :mod:`lipcast.streaming.frames`
composes their pictures and :mod:`lipcast.streaming.tracks` sends them.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.backend import RenderedPatch


@dataclass
class Tick:
    """Everything that leaves the server for one frame."""

    index: int
    frame_index: int  # the avatar frame it shows
    audio: npt.NDArray[np.int16]  # exactly one frame of 48 kHz mono audio
    input_pos: int | None  # 48 kHz position in the caller's stream of the first sample carried, if any
    speech: bool
    conditioning: npt.NDArray[np.float32]
    patch: Future[RenderedPatch] | None  # None: the avatar frame as it is (mouth at rest)
    produced_s: float
    featurize_ms: float
    render_ms: float | None = None  # submit -> patch ready
    buffer_ms: float | None = None  # how long the audio pulled at this tick waited in the jitter buffer
    late_ms: float = 0.0  # produced this long after its due time (event loop delays)
    mix: float = 1.0  # weight of the patch over the avatar frame (< 1 while crossfading)
