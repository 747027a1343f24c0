"""Offline rendering: an audio file in, a lip-synced MP4 out, through the same featurizer, engine and
compositing as a live call, batched at the engine's largest bucket.

The output's audio is the input delayed by the backend's lookahead, exactly as a live call sends it, so
every video frame sits with its own audio (A/V in sync by construction).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TextIO

import av
import numpy as np
import numpy.typing as npt

from lipcast.pipeline.audio_file import decode_audio
from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.compositing import paste_patch
from lipcast.pipeline.engine import RenderEngine
from lipcast.pipeline.timing import FEATURE_SAMPLE_RATE_HZ, FPS, MEDIA_SAMPLE_RATE_HZ
from lipcast.pipeline.windows import FrameGrid

Progress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class RenderSummary:
    frames: int
    audio_s: float
    wall_s: float
    rendered: int  # frames that ran through the backend (the rest were the avatar at rest)

    @property
    def realtime_factor(self) -> float:
        return self.audio_s / self.wall_s if self.wall_s > 0 else float("inf")


def text_progress(stream: TextIO = sys.stderr) -> Progress:
    def report(done: int, total: int, elapsed_s: float) -> None:
        width = 30
        filled = width * done // max(1, total)
        speed = done / FPS / elapsed_s if elapsed_s > 0 else 0.0
        stream.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} frames, {speed:.2f}x real time"
        )
        if done == total:
            stream.write("\n")
        stream.flush()

    return report


def render_file(
    engine: RenderEngine,
    avatar: Avatar,
    audio_path: Path,
    out_path: Path,
    *,
    fps: int = FPS,
    progress: Progress | None = None,
) -> RenderSummary:
    """Render ``audio_path`` with ``avatar`` into ``out_path`` (H.264 + AAC MP4). The engine must run."""
    grid = FrameGrid(fps)
    hop = grid.samples_per_frame
    start = time.monotonic()
    features = decode_audio(audio_path, FEATURE_SAMPLE_RATE_HZ)
    voice = decode_audio(audio_path, MEDIA_SAMPLE_RATE_HZ)
    featurizer = engine.backend.new_featurizer()
    lookahead = featurizer.lookahead_samples
    frames = -(-(len(features) + lookahead) // hop)  # every input sample ends up in some frame
    padded = np.zeros(frames * hop, np.float32)
    padded[: len(features)] = features
    window = engine.batch_sizes[-1] * 4  # frames in flight: enough to fill the largest batch, bounded
    rendered = 0
    with _Writer(out_path, avatar, fps) as writer:
        writer.audio(voice, delay_s=lookahead / FEATURE_SAMPLE_RATE_HZ)
        pending: list[tuple[int, Future[RenderedPatch] | None]] = []
        for index in range(frames):
            conditioning = featurizer.push(padded[index * hop : (index + 1) * hop])
            frame_index = index % avatar.frame_count
            future = None
            if not featurizer.is_at_rest(conditioning, True):  # offline: no voice-activity detector
                future = engine.submit("offline", RenderItem(avatar.name, frame_index, conditioning))
                rendered += 1
            pending.append((frame_index, future))
            if len(pending) >= window or index == frames - 1:
                for frame_index, future in pending:
                    writer.video(avatar.frames[frame_index], future.result() if future else None)
                done = index + 1
                pending.clear()
                if progress:
                    progress(done, frames, time.monotonic() - start)
    return RenderSummary(frames, len(voice) / MEDIA_SAMPLE_RATE_HZ, time.monotonic() - start, rendered)


class _Writer:
    """H.264 video (yuv420p, even size) and AAC audio into an MP4."""

    def __init__(self, path: Path, avatar: Avatar, fps: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(path), mode="w")
        self.width, self.height = avatar.width // 2 * 2, avatar.height // 2 * 2
        self.video_stream = self.container.add_stream("libx264", rate=fps)
        self.video_stream.width, self.video_stream.height = self.width, self.height
        self.video_stream.pix_fmt = "yuv420p"
        self.video_stream.options = {"preset": "veryfast", "crf": "18"}
        self.audio_stream = self.container.add_stream("aac", rate=MEDIA_SAMPLE_RATE_HZ)
        self.audio_stream.layout = "mono"
        self.pts = 0

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        for packet in self.video_stream.encode(None):
            self.container.mux(packet)
        for packet in self.audio_stream.encode(None):
            self.container.mux(packet)
        self.container.close()

    def audio(self, samples: npt.NDArray[np.float32], delay_s: float) -> None:
        lead = np.zeros(round(delay_s * MEDIA_SAMPLE_RATE_HZ), np.float32)
        data = np.concatenate([lead, samples]).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(data, format="flt", layout="mono")
        frame.sample_rate = MEDIA_SAMPLE_RATE_HZ
        frame.pts = 0
        frame.time_base = Fraction(1, MEDIA_SAMPLE_RATE_HZ)
        for packet in self.audio_stream.encode(frame):
            self.container.mux(packet)

    def video(self, base: npt.NDArray[np.uint8], patch: RenderedPatch | None) -> None:
        image = base if patch is None else paste_patch(base, patch)
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image[: self.height, : self.width]), "rgb24")
        frame.pts = self.pts
        self.pts += 1
        for packet in self.video_stream.encode(frame):
            self.container.mux(packet)
