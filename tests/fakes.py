"""Test doubles: a clock advanced by hand, generated speech-like audio, a tiny deterministic backend."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ

SAMPLE_RATE_HZ = MEDIA_SAMPLE_RATE_HZ


class FakeClock:
    """A monotonic clock that only moves when the test calls :meth:`advance`."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now = start_s
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline_s: float) -> None:
        if deadline_s <= self._now:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline_s, next(self._counter), future))
        await future

    async def advance(self, seconds: float, step_s: float = 0.005) -> None:
        """Move time forward in small steps, letting woken tasks run at each step."""
        end = self._now + seconds
        while self._now < end - 1e-12:
            self._now = min(end, self._now + step_s)
            while self._sleepers and self._sleepers[0][0] <= self._now + 1e-12:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
            for _ in range(5):
                await asyncio.sleep(0)


def voiced_burst(
    duration_s: float, f0_hz: float = 140.0, level: float = 0.3, rate_hz: int = SAMPLE_RATE_HZ, seed: int = 0
) -> npt.NDArray[np.float32]:
    """A vowel-like sound: harmonics of ``f0_hz`` shaped by two formant peaks, with a soft envelope."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(duration_s * rate_hz)) / rate_hz
    vibrato = 1.0 + 0.01 * np.sin(2 * np.pi * 5.0 * t)
    phase = 2 * np.pi * f0_hz * np.cumsum(vibrato) / rate_hz
    signal = np.zeros_like(t)
    for k in range(1, int(3800 / f0_hz)):
        freq = k * f0_hz
        gain = np.exp(-(((freq - 700) / 250) ** 2)) + 0.6 * np.exp(-(((freq - 1200) / 300) ** 2)) + 0.05
        signal += gain * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
    envelope = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.02)
    signal *= envelope / (np.abs(signal).max() + 1e-9)
    return (level * signal).astype(np.float32)


def speech_pattern(
    pattern: Sequence[tuple[str, float]],
    rate_hz: int = SAMPLE_RATE_HZ,
    noise_level: float = 0.0005,
    seed: int = 1,
) -> npt.NDArray[np.float32]:
    """Concatenate ("speech"|"silence", seconds) segments; silence carries a faint noise floor."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, (kind, seconds) in enumerate(pattern):
        n = int(seconds * rate_hz)
        if kind == "speech":
            parts.append(voiced_burst(seconds, f0_hz=120 + 15 * (i % 4), rate_hz=rate_hz, seed=i))
        elif kind == "silence":
            parts.append(np.zeros(n, np.float32))
        else:
            raise ValueError(kind)
    audio = np.concatenate(parts)
    return (audio + noise_level * rng.standard_normal(len(audio))).astype(np.float32)


def to_int16(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.int16]:
    return np.clip(np.round(audio * 32767), -32768, 32767).astype(np.int16)


class LevelFeaturizer:
    """Conditioning = [RMS of the hop]; at rest below a threshold. No lookahead unless asked."""

    def __init__(self, lookahead_samples: int = 0) -> None:
        self._lookahead = lookahead_samples
        self._history = np.zeros(0, np.float32)

    @property
    def lookahead_samples(self) -> int:
        return self._lookahead

    def push(self, hop: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        self._history = np.concatenate([self._history, hop])[-(len(hop) + self._lookahead) :]
        own = self._history[: len(hop)] if self._lookahead else hop
        return np.array([float(np.sqrt(np.mean(own.astype(np.float64) ** 2)))], np.float32)

    def is_at_rest(self, conditioning: npt.NDArray[np.float32], speech: bool = False) -> bool:
        return float(conditioning[0]) < 0.01


class FakeBackend:
    """Paints a mouth box whose brightness is the conditioning level; records every batch it renders."""

    name = "fake"

    def __init__(self, lookahead_samples: int = 0) -> None:
        self.lookahead_samples = lookahead_samples
        self.batches: list[list[RenderItem]] = []
        self.avatars: dict[str, Avatar] = {}
        self.fail_next = False

    @property
    def conditioning_shape(self) -> tuple[int, ...]:
        return (1,)

    @property
    def lookahead_ms(self) -> float:
        return self.lookahead_samples / 16.0

    crossfade_frames = 1

    def new_featurizer(self) -> LevelFeaturizer:
        return LevelFeaturizer(self.lookahead_samples)

    def add_avatar(self, avatar: Avatar) -> None:
        self.avatars[avatar.name] = avatar

    def remove_avatar(self, name: str) -> None:
        self.avatars.pop(name, None)

    def render(self, items: Sequence[RenderItem]) -> list[RenderedPatch]:
        self.batches.append(list(items))
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected render failure")
        out = []
        for item in items:
            value = int(min(255, 40 + 2000 * float(item.conditioning[0])))
            pixels = np.full((8, 8, 3), value, np.uint8)
            out.append(RenderedPatch(pixels, top=4, left=4))
        return out


def tiny_avatar(name: str = "tiny", frames: int = 1, size: int = 32) -> Avatar:
    rng = np.random.default_rng(7)
    images = rng.integers(0, 255, (frames, size, size, 3), dtype=np.uint8)
    boxes = np.tile(np.array([[4, 4, size - 4, size - 4]], np.int32), (frames, 1))
    mouths = np.tile(np.array([[10, 20, 22, 20, 20, 28]], np.float32), (frames, 1))
    return Avatar(name, 25, images, boxes, mouths)
