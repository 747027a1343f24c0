"""The built-in lip-sync backend: no downloaded weights, a few mouth parameters, an analytic warp.

Per session a :class:`lipcast.pipeline.features.MouthFeaturizer` turns audio into ``[open, wide, round]`` per
frame; per batch :func:`lipcast.pipeline.mouth_warp.render_mouths` animates each frame's mouth region (ROI).
The ROI is a fixed-size box around the mouth and chin (the same size for every frame of an avatar, placed per
frame and kept inside it), so one avatar's items stack into one tensor and one ``grid_sample`` call.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt
import torch

from lipcast.pipeline.avatar import Avatar, UnknownAvatarError
from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.defaults import BUILTIN
from lipcast.pipeline.features import CONDITIONING_SIZE, DEFAULT_LOOKAHEAD_MS, MouthFeaturizer
from lipcast.pipeline.mouth_warp import render_mouths
from lipcast.pipeline.windows import FrameGrid

logger = logging.getLogger(__name__)

# ROI around the mouth, in mouth widths (corner to corner).
ROI_HALF_WIDTH_PER_WIDTH = 1.3  # to each side of the mouth centre (the sideways pull fades by 1.1)
ROI_ABOVE_PER_WIDTH = 0.55  # above the higher lip corner
ROI_BELOW_CHIN_PER_WIDTH = 0.9  # below the chin: room for the dropped chin to squeeze the neck
ROI_ALIGN_PX = 8  # ROI sides are multiples of this (friendly to vectorised kernels)
# The backend's own resolution: a wider mouth ROI (an HD avatar's) is rendered scaled down to this width and
# its patch scaled up by the paste, once, into the output picture (the 320 px portrait's ROI is 112 wide, at
# its own size). At 1280x720 the warp then costs what it costs at 320 px instead of 5x that.
MAX_RENDER_WIDTH_PX = 128


@dataclass(frozen=True)
class MouthRois:
    """Where an avatar's mouth ROIs lie: one ``height x width`` box per frame at ``tops[i], lefts[i]``."""

    height: int
    width: int
    tops: npt.NDArray[np.int64]
    lefts: npt.NDArray[np.int64]


def mouth_rois(avatar: Avatar) -> MouthRois:
    """Fixed-size ROIs covering each frame's mouth and chin, shifted (not shrunk) to stay inside the frame."""
    mouths = avatar.mouths.astype(np.float64)
    left_x, left_y, right_x, right_y, _, chin_y = (mouths[:, i] for i in range(6))
    mouth_width = right_x - left_x
    top_y = np.minimum(left_y, right_y) - ROI_ABOVE_PER_WIDTH * mouth_width
    bottom_y = chin_y + ROI_BELOW_CHIN_PER_WIDTH * mouth_width
    width = _aligned(2.0 * ROI_HALF_WIDTH_PER_WIDTH * float(mouth_width.max()), avatar.width)
    height = _aligned(float((bottom_y - top_y).max()), avatar.height)
    centre_x = (left_x + right_x) / 2.0
    lefts = np.clip(np.round(centre_x - width / 2.0), 0, avatar.width - width).astype(np.int64)
    # Centre the spare rows around the needed span, so both the top and the chin keep a margin.
    spare = height - (bottom_y - top_y)
    tops = np.clip(np.round(top_y - spare / 2.0), 0, avatar.height - height).astype(np.int64)
    return MouthRois(height, width, tops, lefts)


def _aligned(size_px: float, limit_px: int) -> int:
    return min(limit_px, ROI_ALIGN_PX * math.ceil(size_px / ROI_ALIGN_PX))


@dataclass(frozen=True)
class _PreparedAvatar:
    """An avatar's assets on the device."""

    rois: torch.Tensor  # (T, 3, h, w) uint8 RGB
    geometry: torch.Tensor  # (T, 6) float32 mouth fields in ROI coordinates
    tops: npt.NDArray[np.int64]  # (T,)
    lefts: npt.NDArray[np.int64]  # (T,)
    frame_count: int
    box: tuple[int, int] | None = None  # (h, w) in the frame when rendered smaller (MAX_RENDER_WIDTH_PX)


class BuiltinBackend:
    """:class:`lipcast.pipeline.backend.LipSyncBackend` with an analytic mouth warp; the same code on CPU and
    CUDA.

    Conditioning: float32 ``(3,)`` = ``[open, wide, round]`` in [0, 1] (see :mod:`lipcast.pipeline.features`).
    """

    name = BUILTIN
    # A frame rendered at rest is the avatar frame itself, but the attack is fast (a syllable can open the
    # mouth most of the way in one frame): blend the first frames out of idle so a switch is no jump.
    crossfade_frames = 3

    def __init__(
        self,
        device: torch.device,
        *,
        lookahead_ms: float = DEFAULT_LOOKAHEAD_MS,
        grid: FrameGrid | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.grid = grid or FrameGrid()
        self._lookahead_ms = lookahead_ms
        self._avatars: dict[str, _PreparedAvatar] = {}

    @property
    def conditioning_shape(self) -> tuple[int, ...]:
        return (CONDITIONING_SIZE,)

    @property
    def lookahead_ms(self) -> float:
        """The featurizer's lookahead, rounded up to whole samples."""
        return self.grid.samples_to_ms(self.grid.ms_to_samples(self._lookahead_ms))

    def new_featurizer(self) -> MouthFeaturizer:
        return MouthFeaturizer(lookahead_ms=self._lookahead_ms, grid=self.grid)

    def add_avatar(self, avatar: Avatar) -> None:
        boxes = mouth_rois(avatar)
        rows = np.arange(boxes.height)[None, :, None] + boxes.tops[:, None, None]  # (T, h, 1)
        cols = np.arange(boxes.width)[None, None, :] + boxes.lefts[:, None, None]  # (T, 1, w)
        frame_ids = np.arange(avatar.frame_count)[:, None, None]
        rois = avatar.frames[frame_ids, rows, cols]  # (T, h, w, 3)
        geometry = avatar.mouths.astype(np.float32).copy()
        geometry[:, [0, 2]] -= boxes.lefts[:, None].astype(np.float32)
        geometry[:, [1, 3, 4, 5]] -= boxes.tops[:, None].astype(np.float32)
        box = None
        if boxes.width > MAX_RENDER_WIDTH_PX:
            scale = MAX_RENDER_WIDTH_PX / boxes.width
            size = (MAX_RENDER_WIDTH_PX, max(8, round(boxes.height * scale)))  # (w, h) for OpenCV
            rois = np.stack([cv2.resize(r, size, interpolation=cv2.INTER_AREA) for r in rois])
            # Pixel centres: x_small = (x + 0.5) * scale_x - 0.5, per axis.
            sx, sy = size[0] / boxes.width, size[1] / boxes.height
            geometry[:, [0, 2]] = (geometry[:, [0, 2]] + 0.5) * sx - 0.5
            geometry[:, [1, 3, 4, 5]] = (geometry[:, [1, 3, 4, 5]] + 0.5) * sy - 0.5
            box = (boxes.height, boxes.width)
        self._avatars[avatar.name] = _PreparedAvatar(
            rois=torch.from_numpy(np.ascontiguousarray(rois.transpose(0, 3, 1, 2))).to(self.device),
            geometry=torch.from_numpy(geometry).to(self.device),
            tops=boxes.tops,
            lefts=boxes.lefts,
            frame_count=avatar.frame_count,
            box=box,
        )
        logger.info(
            "builtin backend: avatar %r ready, %d frame(s), mouth ROI %dx%d",
            avatar.name,
            avatar.frame_count,
            boxes.width,
            boxes.height,
        )

    def remove_avatar(self, name: str) -> None:
        self._avatars.pop(name, None)

    def render(self, items: Sequence[RenderItem]) -> list[RenderedPatch]:
        """Render a batch: items are grouped by avatar, each group in one vectorised pass."""
        groups: dict[str, list[int]] = {}
        for position, item in enumerate(items):
            if item.avatar not in self._avatars:
                raise UnknownAvatarError(f"avatar {item.avatar!r} was not added to the backend")
            groups.setdefault(item.avatar, []).append(position)
        patches: list[RenderedPatch | None] = [None] * len(items)
        with torch.inference_mode():
            for name, positions in groups.items():
                group = [items[p] for p in positions]
                for position, patch in zip(positions, self._render_group(name, group), strict=True):
                    patches[position] = patch
        return [p for p in patches if p is not None]

    def _render_group(self, name: str, items: Sequence[RenderItem]) -> list[RenderedPatch]:
        prepared = self._avatars[name]
        frame_ids = np.array([item.frame_index % prepared.frame_count for item in items])
        params = np.stack([_checked_conditioning(item.conditioning) for item in items])
        index = torch.from_numpy(frame_ids).to(self.device)
        rois = prepared.rois.index_select(0, index).float()  # (B, 3, h, w)
        geometry = prepared.geometry.index_select(0, index)  # (B, 6)
        params_t = torch.from_numpy(params).to(self.device)  # (B, 3)
        out = render_mouths(rois, geometry, params_t)
        pixels = out.round_().clamp_(0.0, 255.0).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        return [
            RenderedPatch(
                np.ascontiguousarray(pixels[i]), int(prepared.tops[f]), int(prepared.lefts[f]), prepared.box
            )
            for i, f in enumerate(frame_ids)
        ]


def _checked_conditioning(conditioning: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    values = np.asarray(conditioning, dtype=np.float32).reshape(-1)
    if values.shape != (CONDITIONING_SIZE,):
        raise ValueError(f"expected conditioning of shape ({CONDITIONING_SIZE},), got {values.shape}")
    return np.clip(np.nan_to_num(values), 0.0, 1.0)
