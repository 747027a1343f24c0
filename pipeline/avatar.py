"""Avatars: a directory with a versioned manifest, its frames, face boxes and mouth geometry.

Layout of an avatar directory::

    NAME/
      manifest.json     {"version": 1, "name", "fps", "width", "height", "frames": [...],
                         "face_boxes": [[x1, y1, x2, y2], ...],
                         "mouths": [[lx, ly, rx, ry, lip_y, chin_y], ...],
                         optional "eyes": [[lx, ly, rx, ry], ...], "idle_motion", "source", "license", ...}
      frames/000000.png ...

Coordinates are frame pixels, x to the right, y down. Face boxes are ``[x1, y1, x2, y2)``. A mouth row is the
left and right lip corners, the y where the lips meet on the mouth's centre line, and the y of the chin's
lowest point. An eyes row (optional, version 1 files without it still load) is the centres of the eye on the
frame's left and of the one on its right; a still avatar with eyes blinks at rest
(:mod:`lipcast.pipeline.idle`). ``idle_motion`` (default true) lets a one-frame avatar breathe and blink at
rest. Frames are kept as RGB uint8 (PNG or JPEG files).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
BUILTIN_AVATAR_DIR = Path(str(resources.files("lipcast.pipeline") / "avatars"))  # inside the package
DEFAULT_AVATAR = "astronaut"
JPEG_QUALITY = 95  # frames of video avatars (the source is lossy already)
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
MOUTH_FIELDS = ("left_x", "left_y", "right_x", "right_y", "lip_y", "chin_y")
EYE_FIELDS = ("left_x", "left_y", "right_x", "right_y")
META_KEYS = ("source", "license", "description", "idle_motion", "prepared")


class AvatarError(ValueError):
    """An avatar is missing, malformed or inconsistent."""


class UnknownAvatarError(AvatarError, KeyError):
    """No avatar of that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class MouthGeometry:
    left_x: float
    left_y: float
    right_x: float
    right_y: float
    lip_y: float
    chin_y: float

    @property
    def center_x(self) -> float:
        return (self.left_x + self.right_x) / 2.0

    @property
    def width(self) -> float:
        return self.right_x - self.left_x


@dataclass(frozen=True, eq=False)
class Avatar:
    """An avatar in memory.

    ``frames``: (T, H, W, 3) uint8 RGB; ``face_boxes``: (T, 4) int32 x1, y1, x2, y2;
    ``mouths``: (T, 6) float32 in :data:`MOUTH_FIELDS` order; ``eyes``: None or (T, 4) float32 in
    :data:`EYE_FIELDS` order.
    """

    name: str
    fps: int
    frames: npt.NDArray[np.uint8]
    face_boxes: npt.NDArray[np.int32]
    mouths: npt.NDArray[np.float32]
    root: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    eyes: npt.NDArray[np.float32] | None = None

    def __post_init__(self) -> None:
        validate_arrays(self.name, self.frames, self.face_boxes, self.mouths, self.eyes)

    @property
    def frame_count(self) -> int:
        return int(self.frames.shape[0])

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    def mouth(self, frame_index: int) -> MouthGeometry:
        return MouthGeometry(*(float(v) for v in self.mouths[frame_index]))


def validate_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise AvatarError(f"invalid avatar name {name!r}: use 1-63 lowercase letters, digits, '-' or '_'")
    return name


def validate_arrays(
    name: str,
    frames: npt.NDArray[np.uint8],
    face_boxes: npt.NDArray[np.int32],
    mouths: npt.NDArray[np.float32],
    eyes: npt.NDArray[np.float32] | None = None,
) -> None:
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8:
        raise AvatarError(f"avatar {name!r}: frames must be (T, H, W, 3) uint8, got {frames.shape}")
    count, height, width = frames.shape[:3]
    if count == 0:
        raise AvatarError(f"avatar {name!r} has no frames")
    if face_boxes.shape != (count, 4):
        raise AvatarError(f"avatar {name!r}: {count} frames but face_boxes has shape {face_boxes.shape}")
    if mouths.shape != (count, len(MOUTH_FIELDS)):
        raise AvatarError(f"avatar {name!r}: {count} frames but mouths has shape {mouths.shape}")
    x1, y1, x2, y2 = (face_boxes[:, i] for i in range(4))
    if (x1 < 0).any() or (y1 < 0).any() or (x2 > width).any() or (y2 > height).any():
        raise AvatarError(f"avatar {name!r}: a face box lies outside the {width}x{height} frame")
    if (x2 <= x1).any() or (y2 <= y1).any():
        raise AvatarError(f"avatar {name!r}: a face box is empty")
    lx, _, rx, _, lip_y, chin_y = (mouths[:, i] for i in range(6))
    if (rx <= lx).any() or (chin_y <= lip_y).any():
        raise AvatarError(f"avatar {name!r}: mouth geometry is inconsistent (corners or chin)")
    if (mouths < 0).any() or (mouths[:, [0, 2]] >= width).any() or (mouths[:, [1, 3, 4, 5]] >= height).any():
        raise AvatarError(f"avatar {name!r}: mouth geometry lies outside the frame")
    if eyes is None:
        return
    if eyes.shape != (count, len(EYE_FIELDS)):
        raise AvatarError(f"avatar {name!r}: {count} frames but eyes has shape {eyes.shape}")
    if not np.isfinite(eyes).all() or (eyes[:, 2] <= eyes[:, 0]).any():
        raise AvatarError(f"avatar {name!r}: eye positions are inconsistent (left eye not left of right)")
    if (eyes < 0).any() or (eyes[:, [0, 2]] >= width).any() or (eyes[:, [1, 3]] >= height).any():
        raise AvatarError(f"avatar {name!r}: eye positions lie outside the frame")


def _read_rgb(path: Path) -> npt.NDArray[np.uint8]:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise AvatarError(f"cannot read avatar frame {path}")
    return np.ascontiguousarray(cv2.cvtColor(image, cv2.COLOR_BGR2RGB))


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise AvatarError(f"avatar directory {root} has no {MANIFEST_NAME}") from e
    except json.JSONDecodeError as e:
        raise AvatarError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(manifest, dict):
        raise AvatarError(f"{path} must hold a JSON object")
    version = manifest.get("version")
    if version != MANIFEST_VERSION:
        raise AvatarError(
            f"{path}: manifest version {version!r} is not supported (expected {MANIFEST_VERSION})"
        )
    for key in ("name", "fps", "frames", "face_boxes", "mouths"):
        if key not in manifest:
            raise AvatarError(f"{path}: missing {key!r}")
    return manifest


def load_avatar(root: Path) -> Avatar:
    """Load and validate the avatar stored in directory ``root``."""
    manifest = read_manifest(root)
    name = validate_name(str(manifest["name"]))
    frame_files = manifest["frames"]
    if not isinstance(frame_files, list) or not frame_files:
        raise AvatarError(f"avatar {name!r}: 'frames' must be a non-empty list of files")
    frames = []
    for rel in frame_files:
        path = (root / str(rel)).resolve()
        if root.resolve() not in path.parents:
            raise AvatarError(f"avatar {name!r}: frame path {rel!r} leaves the avatar directory")
        frames.append(_read_rgb(path))
    shapes = {f.shape for f in frames}
    if len(shapes) != 1:
        raise AvatarError(f"avatar {name!r}: frames differ in size: {sorted(shapes)}")
    stacked = np.stack(frames)
    width, height = manifest.get("width"), manifest.get("height")
    if (width, height) != (stacked.shape[2], stacked.shape[1]):
        raise AvatarError(
            f"avatar {name!r}: manifest says {width}x{height}, frames are "
            f"{stacked.shape[2]}x{stacked.shape[1]}"
        )
    try:
        boxes = np.asarray(manifest["face_boxes"], dtype=np.int32)
        mouths = np.asarray(manifest["mouths"], dtype=np.float32)
        eyes = None if manifest.get("eyes") is None else np.asarray(manifest["eyes"], dtype=np.float32)
        fps = int(manifest["fps"])
    except (TypeError, ValueError) as e:
        raise AvatarError(f"avatar {name!r}: malformed face_boxes, mouths, eyes or fps: {e}") from e
    if not 1 <= fps <= 120:
        raise AvatarError(f"avatar {name!r}: fps {fps} out of range")
    meta = {k: v for k, v in manifest.items() if k in META_KEYS}
    return Avatar(name, fps, stacked, boxes, mouths, root=root, meta=meta, eyes=eyes)


def write_frame(root: Path, index: int, frame: npt.NDArray[np.uint8], extension: str = "png") -> str:
    """Write RGB ``frame`` as ``frames/NNNNNN.<extension>`` under ``root``; returns that relative path."""
    rel = f"frames/{index:06d}.{extension}"
    params = [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY] if extension == "jpg" else []
    if not cv2.imwrite(str(root / rel), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), params):
        raise AvatarError(f"cannot write {root / rel}")
    return rel


def write_manifest(
    root: Path,
    *,
    name: str,
    fps: int,
    width: int,
    height: int,
    frame_files: list[str],
    face_boxes: npt.NDArray[np.int32],
    mouths: npt.NDArray[np.float32],
    eyes: npt.NDArray[np.float32] | None = None,
    **meta: Any,
) -> Path:
    """Write ``root/manifest.json`` (version :data:`MANIFEST_VERSION`). Returns its path."""
    manifest: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "name": name,
        "fps": fps,
        "width": width,
        "height": height,
        "frames": frame_files,
        "face_boxes": np.asarray(face_boxes, dtype=np.int32).tolist(),
        "mouths": _rounded_rows(mouths),
    }
    if eyes is not None:
        manifest["eyes"] = _rounded_rows(eyes)
    manifest.update(meta)
    path = root / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return path


def _rounded_rows(rows: npt.NDArray[np.float32]) -> list[list[float]]:
    return [[round(float(v), 2) for v in row] for row in rows]


def write_avatar(avatar: Avatar, root: Path, **meta: Any) -> Path:
    """Write ``avatar`` as an avatar directory (frames as PNG). Returns the manifest path."""
    (root / "frames").mkdir(parents=True, exist_ok=True)
    names = [write_frame(root, i, frame) for i, frame in enumerate(avatar.frames)]
    return write_manifest(
        root,
        name=avatar.name,
        fps=avatar.fps,
        width=avatar.width,
        height=avatar.height,
        frame_files=names,
        face_boxes=avatar.face_boxes,
        mouths=avatar.mouths,
        eyes=avatar.eyes,
        **{**avatar.meta, **meta},
    )


def discover_avatars(directories: Iterable[Path]) -> dict[str, Path]:
    """Map avatar name -> directory for every ``*/manifest.json`` in ``directories``.

    Earlier directories win on a name clash, so a user's directory listed first overrides a built-in.
    """
    found: dict[str, Path] = {}
    for directory in directories:
        if not directory.is_dir():
            continue
        for manifest in sorted(directory.glob(f"*/{MANIFEST_NAME}")):
            if manifest.parent.name.startswith("."):  # work directories of preparations in progress
                continue
            found.setdefault(manifest.parent.name, manifest.parent)
    return found
