"""Idle <-> speaking switches: the mouth region changes no more at a switch than during ordinary speech.

The session's producer runs tick by tick on real audio (syllables with short gaps, pauses between
utterances), real voice-activity flags and a backend rendering synchronously; every frame is composed as the
video track composes it (:func:`lipcast.pipeline.compositing.paste_patch` with the tick's crossfade weight).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, DEFAULT_AVATAR, Avatar, load_avatar
from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.builtin import BuiltinBackend
from lipcast.pipeline.compositing import paste_patch
from lipcast.pipeline.idle import with_idle_motion
from lipcast.streaming.audio_buffer import InputAudioBuffer
from lipcast.streaming.avatar_stream import CROSSFADE_FRAMES, AvatarStream
from lipcast.streaming.clock import FrameTimeline
from lipcast.streaming.vad import SpeechDetector
from tests.fakes import FakeClock, LevelFeaturizer, speech_pattern, to_int16

TICK_SAMPLES = 1920  # 40 ms at 48 kHz
BLOCK_SAMPLES = 960  # the ingest pushes 20 ms blocks, each with its VAD flag


def utterance(syllables: int) -> list[tuple[str, float]]:
    """Syllables of 130-230 ms with 40-90 ms dips between them: ordinary speech, never idle inside."""
    pattern: list[tuple[str, float]] = []
    for i in range(syllables):
        pattern.append(("speech", 0.13 + 0.05 * (i % 3)))
        pattern.append(("silence", 0.04 + 0.025 * (i % 3)))
    return pattern[:-1]


PATTERN = [
    ("silence", 0.6),
    *utterance(6),
    ("silence", 0.9),
    *utterance(5),
    ("silence", 0.9),
]


class SyncRenderer:
    """Renders each submitted frame at once on the given backend (deterministic, no engine thread)."""

    def __init__(self, render: Any) -> None:
        self.render = render

    def submit(self, session_id: str, item: RenderItem, *args: Any, **kwargs: Any) -> Future[RenderedPatch]:
        future: Future[RenderedPatch] = Future()
        future.set_result(self.render([item])[0])
        return future

    def cancel_session(self, session_id: str) -> int:
        return 0


def run_session(
    avatar: Avatar, featurizer: Any, renderer: SyncRenderer, audio: npt.NDArray[np.int16], crossfade: int
) -> tuple[list[npt.NDArray[np.uint8]], list[float]]:
    """Frames as the video track composes them, and each tick's crossfade weight (0 = idle)."""
    clock = FakeClock()
    buffer = InputAudioBuffer(48_000, target_ms=40)
    stream = AvatarStream(
        "t", avatar, featurizer, renderer, buffer, clock, render_budget_ms=40, crossfade_frames=crossfade
    )
    stream.timeline = FrameTimeline(clock.now(), 25)
    vad = SpeechDetector(48_000, 2)
    blocks = [audio[i : i + BLOCK_SAMPLES] for i in range(0, len(audio) - BLOCK_SAMPLES + 1, BLOCK_SAMPLES)]
    pushed = 0
    frames, mixes = [], []
    for index in range(len(blocks) // 2 - 2):
        while pushed < 2 * index + 4 and pushed < len(blocks):  # keep the buffer at its target
            buffer.push(blocks[pushed], vad.is_speech(blocks[pushed]))
            pushed += 1
        tick = stream.produce(index)
        base = avatar.frames[tick.frame_index]
        if tick.patch is None:
            frames.append(base)
            mixes.append(0.0)
        else:
            frames.append(paste_patch(base, tick.patch.result(), tick.mix))
            mixes.append(tick.mix)
    return frames, mixes


def mouth_box(avatar: Avatar) -> tuple[int, int, int, int]:
    m = avatar.mouth(0)
    pad = 0.25 * m.width
    return (
        round(m.left_x - pad),
        round(min(m.left_y, m.right_y) - 0.3 * m.width),
        round(m.right_x + pad),
        round(m.chin_y + 0.3 * m.width),
    )


def mouth_changes(
    frames: list[npt.NDArray[np.uint8]], box: tuple[int, int, int, int]
) -> npt.NDArray[np.float64]:
    """Mean absolute change of the mouth region from each frame to the next (``len(frames) - 1`` values)."""
    x1, y1, x2, y2 = box
    regions = np.stack([f[y1:y2, x1:x2] for f in frames]).astype(np.float64)
    return np.abs(np.diff(regions, axis=0)).mean(axis=(1, 2, 3))


def switch_windows(mixes: list[float], width: int) -> tuple[list[int], list[int]]:
    """Change indices (frame k-1 -> k, as index k-1) around idle<->speaking switches, and inside speech."""
    switches, speech = set(), []
    for k in range(1, len(mixes)):
        if (mixes[k - 1] == 0.0) != (mixes[k] == 0.0):
            switches.update(range(max(0, k - 2), min(len(mixes) - 1, k + width + 1)))
    for k in range(1, len(mixes)):
        if mixes[k - 1] == 1.0 and mixes[k] == 1.0 and (k - 1) not in switches:
            speech.append(k - 1)
    return sorted(switches), speech


def test_switches_change_the_mouth_no_more_than_ordinary_speech() -> None:
    avatar = with_idle_motion(load_avatar(BUILTIN_AVATAR_DIR / DEFAULT_AVATAR))
    backend = BuiltinBackend(torch.device("cpu"))
    backend.add_avatar(avatar)
    audio = to_int16(speech_pattern(PATTERN))
    crossfade = backend.crossfade_frames
    assert crossfade == CROSSFADE_FRAMES
    frames, mixes = run_session(
        avatar, backend.new_featurizer(), SyncRenderer(backend.render), audio, crossfade
    )
    onsets = [k for k in range(1, len(mixes)) if mixes[k - 1] == 0.0 < mixes[k]]
    offsets = [k for k in range(1, len(mixes)) if mixes[k - 1] > 0.0 == mixes[k]]
    assert len(onsets) >= 2 and len(offsets) >= 2, (onsets, offsets)
    assert all(mixes[k] == 1 / 3 for k in onsets)

    changes = mouth_changes(frames, mouth_box(avatar))
    switches, speech = switch_windows(mixes, crossfade)
    assert len(speech) > 30
    largest_switch, largest_speech = changes[switches].max(), changes[speech].max()
    assert largest_speech > 2.0  # the mouth really moves in speech
    assert largest_switch <= largest_speech, (largest_switch, largest_speech)
    # While idle (breathing and blinking outside the mouth), the mouth region does not move at all.
    idle = [k for k in range(1, len(mixes)) if mixes[k - 1] == mixes[k] == 0.0]
    assert changes[[k - 1 for k in idle]].max() == 0.0

    # Without the crossfade the first rendered frame jumps: more than anything in ordinary speech.
    frames, mixes = run_session(avatar, backend.new_featurizer(), SyncRenderer(backend.render), audio, 1)
    switches, _ = switch_windows(mixes, 1)
    assert mouth_changes(frames, mouth_box(avatar))[switches].max() > largest_speech


class RegeneratingBackend:
    """Like Wav2Lip: the rendered region never equals the avatar frame, even for silence (+40 levels)."""

    def __init__(self, avatar: Avatar) -> None:
        self.avatar = avatar

    def render(self, items: list[RenderItem]) -> list[RenderedPatch]:
        out = []
        for item in items:
            region = self.avatar.frames[item.frame_index, 100:200, 100:220].astype(np.int16)
            out.append(RenderedPatch(np.clip(region + 40, 0, 255).astype(np.uint8), 100, 100))
        return out


class NeverRestingFeaturizer(LevelFeaturizer):
    def is_at_rest(self, conditioning: npt.NDArray[np.float32], speech: bool = True) -> bool:
        return not speech  # like Wav2Lip: idling is left to the voice-activity flags


def test_a_backend_that_never_matches_the_frame_fades_in_and_out_instead_of_popping() -> None:
    avatar = with_idle_motion(load_avatar(BUILTIN_AVATAR_DIR / DEFAULT_AVATAR))
    renderer = SyncRenderer(RegeneratingBackend(avatar).render)
    audio = to_int16(speech_pattern([("silence", 0.5), ("speech", 0.6), ("silence", 0.8)]))
    box = (100, 100, 220, 200)
    popping, _ = run_session(avatar, NeverRestingFeaturizer(), renderer, audio, crossfade=1)
    assert mouth_changes(popping, box).max() >= 35.0  # +40 but for pixels already near white
    frames, mixes = run_session(avatar, NeverRestingFeaturizer(), renderer, audio, crossfade=3)
    assert 0.0 in mixes and 1.0 in mixes  # idle without the model on silence, rendered in speech
    assert mouth_changes(frames, box).max() <= 40 / 3 + 1
