"""The lip-sync backend seam.

A backend is split in two along the line between per-session state and batchable work:

* a :class:`Featurizer` is created per session. It is fed the session's 16 kHz mono audio one video-frame
  hop at a time and returns, for every hop, the *conditioning* of one video frame (for the built-in backend
  a few mouth parameters; for Wav2Lip an 80x16 mel window). It keeps whatever streaming state it needs
  (noise floor, smoothing, pre-emphasis, STFT ring).
* the backend's :meth:`LipSyncBackend.render` turns a fixed-size batch of (avatar, avatar frame index,
  conditioning) into image patches. It holds no per-session state, so the engine can batch the frames due
  from every session into one call.

Timing contract (see :mod:`lipcast.pipeline.windows`): after the n-th call to ``Featurizer.push`` (n = 1, 2,
...) the returned conditioning belongs to the video frame whose own audio is the hop that ends
``lookahead_samples`` before the newest pushed sample. The streaming layer therefore delays the outgoing audio
by exactly ``lookahead_samples`` so that each frame leaves with its own audio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

import cv2
import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import Avatar

FloatArray = npt.NDArray[np.float32]
UInt8Array = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class RenderItem:
    """One frame to render: which avatar, which of its frames, the audio conditioning, and the weight of the
    face post-processing (``face_enhance_strength`` of a sharpen session; 0: off, :mod:`.enhance`)."""

    avatar: str
    frame_index: int
    conditioning: FloatArray
    enhance_strength: float = 0.0


@dataclass(frozen=True)
class RenderedPatch:
    """A rendered region of one output frame, RGB uint8 ``(height, width, 3)``, placed at (top, left).

    The caller pastes it into a copy of the avatar frame; only the region that changed travels back from the
    device. ``box``: (height, width) of the frame region it covers when that differs from the pixels' (a
    backend that renders at its own resolution: the paste scales it, once, into the output picture).
    """

    pixels: UInt8Array
    top: int
    left: int
    box: tuple[int, int] | None = None

    @property
    def height(self) -> int:
        return self.box[0] if self.box is not None else int(self.pixels.shape[0])

    @property
    def width(self) -> int:
        return self.box[1] if self.box is not None else int(self.pixels.shape[1])

    def at_box_size(self) -> UInt8Array:
        """The pixels at the size of the region they cover (bilinear; as they are when no ``box``)."""
        if self.box is None or self.box == self.pixels.shape[:2]:
            return self.pixels
        size = (self.box[1], self.box[0])
        return cast(UInt8Array, cv2.resize(self.pixels, size, interpolation=cv2.INTER_LINEAR))


@runtime_checkable
class Featurizer(Protocol):
    """Per-session streaming audio features: one conditioning array per pushed hop."""

    @property
    def lookahead_samples(self) -> int:
        """Audio (16 kHz samples) needed past the end of a frame's own hop before it can be conditioned."""
        ...

    def push(self, hop: FloatArray) -> FloatArray:
        """Feed one hop of 16 kHz mono float32 audio in [-1, 1]; return the conditioning of one frame.

        ``hop`` has exactly ``samples_per_frame`` samples (640 at 25 fps).
        """
        ...

    def is_at_rest(self, conditioning: FloatArray, speech: bool) -> bool:
        """True when this frame needs no rendering: the avatar frame is sent as it is (the mouth at rest).

        ``speech`` is the voice-activity detector's view of the frame's audio (with a short hangover); a
        featurizer whose conditioning shows silence exactly may ignore it, one that cannot tell should
        follow it.
        """
        ...


@runtime_checkable
class LipSyncBackend(Protocol):
    """Renders batches of frames. One instance per process, owned by the engine's worker thread."""

    name: str

    @property
    def conditioning_shape(self) -> tuple[int, ...]:
        """Shape of one frame's conditioning array."""
        ...

    @property
    def lookahead_ms(self) -> float:
        """Audio needed past the end of a frame's own hop, in milliseconds (the backend's added latency)."""
        ...

    @property
    def crossfade_frames(self) -> int:
        """Frames over which switches between the idle avatar and rendered frames blend: 1 when a frame
        rendered at rest equals the avatar frame (nothing to hide), more when it does not."""
        ...

    def new_featurizer(self) -> Featurizer:
        """A fresh per-session featurizer."""
        ...

    def add_avatar(self, avatar: Avatar) -> None:
        """Prepare an avatar's assets (crops, masks, encoder features) on the backend's device."""
        ...

    def remove_avatar(self, name: str) -> None:
        """Drop an avatar's prepared assets."""
        ...

    def render(self, items: Sequence[RenderItem]) -> list[RenderedPatch]:
        """Render a batch. ``len(items)`` is one of the engine's fixed batch sizes (padding included).

        Returns one patch per item, in order. Items may mix avatars. Must be thread-safe with respect to
        ``add_avatar`` only through the engine (which calls both from its worker thread).
        """
        ...
