"""The paste: an avatar frame as yuv420p planes at an output size, and a rendered patch written into a copy.

This module is the one place where a rendered region reaches the outgoing picture (a later sharpening stage
hooks into :func:`paste_into_planes`). Per tick and output size a session pays only for what changes:

- the avatar's frames at each output size in use are converted once (:class:`IdlePlanes`: scaled to fit,
  centred on black, RGB -> yuv420p as swscale would) and shared, read-only, by every session of that avatar
  in the process, built lazily (a frame on its first use) and bounded (:data:`IDLE_PLANES_BUDGET_BYTES` for
  all of them; frames beyond it are converted on every use). The cache holds its avatars weakly: an app
  that is gone leaves nothing in it.
- a tick with a rendered patch copies the frame's planes and writes the patch's region into them
  (:func:`paste_into_planes`): scaled to the output size, converted to yuv420p at its own size, and
  crossfaded with the frame (``mix``) in YUV, where the conversion being affine makes it the same blend.

The patch's region is shrunk to even rows and columns (4:2:0 chroma covers 2x2 pixels): a patch's edges are
its backend's feathered blend into the frame (the frame's own pixels), so the row or column left out is the
frame's anyway.
"""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
from dataclasses import dataclass, field
from typing import cast

import cv2
import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderedPatch
from lipcast.streaming.sizes import OutputSize, Placement, placement

Image = npt.NDArray[np.uint8]
IDLE_PLANES_BUDGET_BYTES = 512 * 1024 * 1024  # converted idle frames kept per process, all avatars and sizes
BLACK_Y, BLACK_C = 16, 128  # limited-range black


def to_yuv420p(image: Image) -> Image:
    """An (H, W, 3) RGB picture of even size as yuv420p planes, (1.5 H, W): Y, then U, then V; what
    swscale (aiortc's conversion) makes of it, to within 1 (BT.601, limited range).

    Luma is OpenCV's. Chroma is not: OpenCV's RGB -> I420 takes each 2x2 block's chroma from its top-left
    pixel alone, where swscale averages each pair of columns and filters rows 1-3-3-1 (rows 2i-1 .. 2i+2).
    Point-sampled chroma is aliased; over VP8 at 40 kbps it left the resting mouth 25 % further (in
    chroma) from the call's first frames, which raised the probe's motion threshold above the second frame
    of a mouth opening: its black-box onset came a frame late. So the chroma is filtered as swscale does,
    on the RGB values (the conversion is affine), then converted by OpenCV at quarter size.
    """
    height, width = image.shape[:2]
    planes = cast(Image, cv2.cvtColor(image, cv2.COLOR_RGB2YUV_I420))
    # Column pairs averaged (an exact 2:1 linear resize), then rows 1-3-3-1 / 8, edge rows repeated.
    half = cv2.resize(image.astype(np.float32), (width // 2, height), interpolation=cv2.INTER_LINEAR)
    even, odd = half[0::2], half[1::2]
    above = np.concatenate([half[:1], odd[:-1]])
    below = np.concatenate([even[1:], half[-1:]])
    rgb = (even + odd) * (3.0 / (8.0 * 255.0)) + (above + below) * (1.0 / (8.0 * 255.0))  # in 0..1
    ycc = cv2.cvtColor(rgb, cv2.COLOR_RGB2YCrCb)  # full-range Cr, Cb around 0.5
    chroma = cv2.convertScaleAbs(ycc, alpha=224.0, beta=16.0)  # limited range: (c - 0.5) * 224 + 128
    count = (height // 2) * (width // 2)
    flat = planes.reshape(-1)
    flat[height * width : height * width + count] = chroma[:, :, 2].reshape(-1)  # U = Cb
    flat[height * width + count :] = chroma[:, :, 1].reshape(-1)  # V = Cr
    return planes


def plane_views(planes: Image, size: OutputSize) -> tuple[Image, Image, Image]:
    """The Y (H, W), U and V (H/2, W/2) planes of a yuv420p buffer (1.5 H, W) as views."""
    width, height = size.width, size.height
    flat = planes.reshape(-1)
    count = (height // 2) * (width // 2)
    y = flat[: width * height].reshape(height, width)
    u = flat[width * height : width * height + count].reshape(height // 2, width // 2)
    v = flat[width * height + count :].reshape(height // 2, width // 2)
    return y, u, v


def scaled_to(image: Image, width: int, height: int) -> Image:
    src_h, src_w = image.shape[:2]
    if (src_w, src_h) == (width, height):
        return image
    shrink = width < src_w or height < src_h
    interpolation = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
    return cast(Image, cv2.resize(image, (width, height), interpolation=interpolation))


def frame_planes(image: Image, place: Placement) -> Image:
    """An avatar frame at ``place``'s output size: scaled to fit, centred on black, as yuv420p planes."""
    size = place.size
    if place.identity:
        return to_yuv420p(np.ascontiguousarray(image))
    planes = np.empty((size.height * 3 // 2, size.width), np.uint8)
    y, u, v = plane_views(planes, size)
    y[:] = BLACK_Y
    u[:] = BLACK_C
    v[:] = BLACK_C
    inner = to_yuv420p(scaled_to(image, place.width, place.height))
    iy, iu, iv = plane_views(inner, OutputSize(place.width, place.height))
    top, left = place.top, place.left
    y[top : top + place.height, left : left + place.width] = iy
    u[top // 2 : (top + place.height) // 2, left // 2 : (left + place.width) // 2] = iu
    v[top // 2 : (top + place.height) // 2, left // 2 : (left + place.width) // 2] = iv
    return planes


def paste_into_planes(
    base: Image, place: Placement, patch: RenderedPatch, mix: float = 1.0, source: Image | None = None
) -> Image:
    """A copy of ``base`` (an avatar frame's planes at ``place``) with ``patch`` (in avatar-frame pixels)
    written into its region, over it with weight ``mix`` (1: replace; below 1: a crossfade toward the
    frame). The one function through which rendered pixels reach the outgoing picture.

    ``source``: the avatar frame in RGB. At the avatar's own size the region is then blended in RGB and
    converted with a row of the frame's context on each side: the planes are exactly those of the whole
    picture converted (:func:`to_yuv420p` of :func:`lipcast.pipeline.compositing.paste_patch`'s picture).
    Scaled (or without ``source``) the patch is resized, converted on its own and blended in YUV."""
    out = base.copy()
    if mix <= 0.0:
        return out
    if place.identity and source is not None:
        _paste_exact(out, place, patch, mix, source)
    else:
        _paste_scaled(out, place, patch, mix)
    return out


def _blend_into(target: Image, value: Image, mix: float) -> None:
    """``target`` <- ``value`` over it with weight ``mix``, rounded as
    :func:`lipcast.pipeline.compositing.paste_patch` rounds."""
    if mix >= 1.0:
        target[:] = value
    else:
        blended = target + (value.astype(np.float32) - target) * np.float32(mix)
        target[:] = (blended + 0.5).astype(np.uint8)


def _write_planes(out: Image, size: OutputSize, converted: Image, top: int, left: int, rows: range) -> None:
    """Rows ``rows`` (even bounds, relative to ``converted``'s top) of ``converted`` (the planes of a region
    at (``top``, ``left``)) into ``out``."""
    rh, rw = converted.shape[0] * 2 // 3, converted.shape[1]
    count = (rh // 2) * (rw // 2)
    flat = converted.reshape(-1)
    ny = converted[:rh]
    nu = flat[rh * rw : rh * rw + count].reshape(rh // 2, rw // 2)
    nv = flat[rh * rw + count :].reshape(rh // 2, rw // 2)
    y, u, v = plane_views(out, size)
    r0, r1 = rows.start, rows.stop
    y[top + r0 : top + r1, left : left + rw] = ny[r0:r1]
    c0, c1, cl = (top + r0) // 2, (top + r1) // 2, left // 2
    u[c0:c1, cl : cl + rw // 2] = nu[r0 // 2 : r1 // 2]
    v[c0:c1, cl : cl + rw // 2] = nv[r0 // 2 : r1 // 2]


def _paste_exact(out: Image, place: Placement, patch: RenderedPatch, mix: float, source: Image) -> None:
    height, width = source.shape[:2]
    pixels = patch.at_box_size()  # as paste_patch scales it
    h, w = pixels.shape[:2]
    # The patch's rows and columns widened to even bounds. Chroma row i filters rows 2i-1 .. 2i+2, so the
    # row pair either side changes too (written), and needs one more pair of the frame's context (read).
    y0, y1 = patch.top // 2 * 2, min(height, -(-(patch.top + h) // 2) * 2)
    x0, x1 = patch.left // 2 * 2, min(width, -(-(patch.left + w) // 2) * 2)
    wy0, wy1 = max(0, y0 - 2), min(height, y1 + 2)
    cy0, cy1 = max(0, y0 - 4), min(height, y1 + 4)
    rgb = source[cy0:cy1, x0:x1].copy()
    region = rgb[patch.top - cy0 : patch.top - cy0 + h, patch.left - x0 : patch.left - x0 + w]
    _blend_into(region, pixels[: region.shape[0], : region.shape[1]], mix)
    _write_planes(out, place.size, to_yuv420p(rgb), cy0, x0, range(wy0 - cy0, wy1 - cy0))


def _paste_scaled(out: Image, place: Placement, patch: RenderedPatch, mix: float) -> None:
    h, w = patch.height, patch.width  # the frame region it covers (its pixels may be fewer: one resize)
    scale = place.scale
    # The patch's box in output pixels (rounded), then shrunk to even edges inside the placed frame: its
    # edges are its backend's feathered blend into the frame, the frame's own pixels.
    y0 = place.top + round(patch.top * scale)
    x0 = place.left + round(patch.left * scale)
    y1 = place.top + round((patch.top + h) * scale)
    x1 = place.left + round((patch.left + w) * scale)
    ey0 = max(y0 + (y0 & 1), place.top)
    ex0 = max(x0 + (x0 & 1), place.left)
    ey1 = min(y1 - (y1 & 1), place.top + place.height)
    ex1 = min(x1 - (x1 & 1), place.left + place.width)
    if ey1 - ey0 < 2 or ex1 - ex0 < 2:
        return
    pixels = scaled_to(patch.pixels, x1 - x0, y1 - y0)
    region = np.ascontiguousarray(pixels[ey0 - y0 : ey1 - y0, ex0 - x0 : ex1 - x0])
    converted = to_yuv420p(region)
    if mix >= 1.0:
        _write_planes(out, place.size, converted, ey0, ex0, range(0, ey1 - ey0))
        return
    # Crossfade in YUV (the conversion is affine): the frame's planes under the region, blended.
    rh, rw = region.shape[:2]
    y, u, v = plane_views(out, place.size)
    flat = converted.reshape(-1)
    count = (rh // 2) * (rw // 2)
    _blend_into(y[ey0:ey1, ex0:ex1], converted[:rh], mix)
    _blend_into(
        u[ey0 // 2 : ey1 // 2, ex0 // 2 : ex1 // 2],
        flat[rh * rw : rh * rw + count].reshape(rh // 2, rw // 2),
        mix,
    )
    _blend_into(
        v[ey0 // 2 : ey1 // 2, ex0 // 2 : ex1 // 2], flat[rh * rw + count :].reshape(rh // 2, rw // 2), mix
    )


@dataclass
class IdlePlaneStats:
    converted: int = 0  # frames converted (kept or not)
    kept_bytes: int = 0  # what the kept frames take
    over_budget: int = 0  # conversions not kept: the budget was full


@dataclass
class _SizedFrames:
    place: Placement
    frames: dict[int, Image] = field(default_factory=dict)


class IdlePlanes:
    """Every avatar's frames as planes at every output size in use, converted once and shared (per
    process). Avatars are held weakly; frames are kept until ``budget_bytes`` is used, then converted on
    every use."""

    def __init__(self, budget_bytes: int = IDLE_PLANES_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.stats = IdlePlaneStats()
        self._lock = threading.Lock()  # encoders' threads and the loop may ask at once
        self._avatars: weakref.WeakKeyDictionary[Avatar, dict[OutputSize, _SizedFrames]] = (
            weakref.WeakKeyDictionary()
        )
        self._bytes: dict[int, int] = {}  # id(avatar's table) -> bytes kept for it

    def placement(self, avatar: Avatar, size: OutputSize) -> Placement:
        return self._sized(avatar, size).place

    def _sized(self, avatar: Avatar, size: OutputSize) -> _SizedFrames:
        with self._lock:
            sizes = self._avatars.get(avatar)
            if sizes is None:
                sizes = self._avatars[avatar] = {}
                # Give the bytes back when the avatar goes (the table goes with it).
                key = id(sizes)
                self._bytes[key] = 0
                weakref.finalize(avatar, self._forget, key)
            sized = sizes.get(size)
            if sized is None:
                sized = sizes[size] = _SizedFrames(placement(avatar.width, avatar.height, size))
            return sized

    def _forget(self, key: int) -> None:
        with self._lock:
            self.stats.kept_bytes -= self._bytes.pop(key, 0)

    def planes(self, avatar: Avatar, frame_index: int, size: OutputSize) -> Image:
        """Frame ``frame_index`` of ``avatar`` at ``size`` (read-only planes)."""
        sized = self._sized(avatar, size)
        planes = sized.frames.get(frame_index)
        if planes is not None:
            return planes
        planes = frame_planes(avatar.frames[frame_index], sized.place)
        planes.flags.writeable = False
        with self._lock:
            self.stats.converted += 1
            if frame_index in sized.frames:
                return sized.frames[frame_index]
            if self.stats.kept_bytes + planes.nbytes > self.budget_bytes:
                self.stats.over_budget += 1
                return planes
            sized.frames[frame_index] = planes
            self.stats.kept_bytes += planes.nbytes
            table = self._avatars.get(avatar)
            if table is not None:
                self._bytes[id(table)] = self._bytes.get(id(table), 0) + planes.nbytes
        return planes

    def avatars(self) -> int:
        return len(self._avatars)

    def prefetch(self, avatar: Avatar, size: OutputSize) -> concurrent.futures.Future[int]:
        """Convert ``avatar``'s frames at ``size`` in a background thread (a new size's first call: 73 idle
        frames at 1280x720 take the better part of a second, which would otherwise be spent on the event
        loop, a frame per tick, as the loop first reaches them). Returns the frames converted there."""

        def convert_all() -> int:
            done = 0
            for index in range(avatar.frame_count):
                if self.stats.kept_bytes >= self.budget_bytes:
                    break
                if index not in self._sized(avatar, size).frames:
                    self.planes(avatar, index, size)
                    done += 1
            return done

        return _PREFETCH.submit(convert_all)


# One thread converts ahead for every session of the process (cv2 and most numpy work run without the GIL).
_PREFETCH = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="idle-planes")
IDLE_PLANES = IdlePlanes()  # the process's one cache
