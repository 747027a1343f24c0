"""Avatar preparation: a user's video or photo -> an avatar directory (:mod:`lipcast.pipeline.avatar`).

Steps: probe the input with PyAV (a video, or a still image); decode it, resampled to the avatar's frame rate
(nearest source frame) and scaled so its longer side is at most ``max_side_px``; find the face in every frame
(:mod:`lipcast.pipeline.face_detect`, following the face chosen in the previous frame); fill frames without a
face by interpolation and smooth the face geometry over time (:mod:`lipcast.pipeline.face_track`); write
frames and manifest.

Everything is written into a hidden work directory next to the destination and renamed into place at the
end, so a failed or interrupted preparation leaves no partial avatar behind. The result is loaded back with
:func:`lipcast.pipeline.avatar.load_avatar`, so whatever the server will check is checked here too.

What each backend derives from the manifest (the built-in backend's mouth ROIs, Wav2Lip's 96x96 face crops
and masks) is computed from these frames and this geometry when the avatar is added to the engine, once,
and kept on the backend's device.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np
import numpy.typing as npt

from lipcast.pipeline.avatar import (
    Avatar,
    load_avatar,
    validate_name,
    write_frame,
    write_manifest,
)
from lipcast.pipeline.face_detect import (
    BOX,
    EYES,
    GEOMETRY_SIZE,
    MOUTH,
    FaceDetector,
    box_detection,
    create_detector,
    face_geometry,
)
from lipcast.pipeline.face_track import (
    FaceTracker,
    NoFaceError,
    PrepareError,
    clamp_geometry,
    fill_gaps,
    int_boxes,
    smooth_over_time,
)
from lipcast.pipeline.timing import FPS

logger = logging.getLogger(__name__)

UInt8Array = npt.NDArray[np.uint8]
FloatArray = npt.NDArray[np.float32]
Progress = Callable[[int, int | None], None]  # (frames done, frames expected or None)

# Avatar frames keep the source's resolution up to 1920 a side (1920x1080): sessions pay per output size, not
# per avatar pixel (streaming/planes.py). Memory does grow with it: frames x width x height x 3 bytes (a 10 s
# 1080p video avatar: 1.5 GB), so a deployment short of memory sets a lower cap.
DEFAULT_MAX_SIDE_PX = 1920
DEFAULT_MAX_DURATION_S = 60.0
FACE_CHECK_FRAMES = FPS  # a face must show within the first second
MIN_FACE_SHARE = 0.5  # ... and in at least this share of all frames
IMAGE_FORMATS = ("image2",)  # and FFmpeg's "*_pipe" image demuxers (png_pipe, jpeg_pipe, ...)


class NotMediaError(PrepareError):
    """The input is not a video or an image."""


class InputLimitError(PrepareError):
    """The input is longer, larger or of a higher resolution than allowed."""


class AvatarExistsError(PrepareError):
    """An avatar of that name exists already."""


@dataclass(frozen=True)
class MediaInfo:
    kind: str  # "video" or "image"
    width: int  # as displayed (rotation applied)
    height: int
    duration_s: float | None  # None: unknown (or an image)
    fps: float | None
    rotation_deg: int  # counter-clockwise rotation needed for display
    format_name: str


@dataclass(frozen=True)
class PrepareOptions:
    fps: int = FPS
    max_side_px: int = DEFAULT_MAX_SIDE_PX
    max_duration_s: float = DEFAULT_MAX_DURATION_S
    truncate: bool = True  # longer inputs: keep the first max_duration_s (else refuse them)
    max_input_side_px: int | None = None  # refuse inputs with a longer side than this
    box: tuple[float, float, float, float] | None = None  # manual face box in input pixels, every frame
    detector_model: Path | None = None  # YuNet ONNX file; None: the Haar cascade


def probe_media(path: Path) -> MediaInfo:
    """What ``path`` holds, from its headers. Raises :class:`NotMediaError` if no video or image."""
    if not path.is_file():
        raise PrepareError(f"input {path} does not exist")
    try:
        with av.open(str(path)) as container:
            streams = [s for s in container.streams.video if not _is_cover_art(s)]
            if not streams:
                raise NotMediaError(f"{path.name}: no video or image in this file")
            stream = streams[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            format_name = container.format.name.split(",")[0]
            duration_s = None
            if stream.duration is not None and stream.time_base is not None:
                duration_s = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                duration_s = container.duration / av.time_base
            rate = stream.average_rate or stream.guessed_rate
            still = format_name in IMAGE_FORMATS or format_name.endswith("_pipe")
            rotation = 0 if still else _stream_rotation(container, stream)
    except av.FFmpegError as e:
        raise NotMediaError(f"{path.name} is not a video or an image this server can read") from e
    if width <= 0 or height <= 0:
        raise NotMediaError(f"{path.name}: the picture has no size")
    if rotation % 180:
        width, height = height, width
    return MediaInfo(
        kind="image" if still else "video",
        width=width,
        height=height,
        duration_s=None if still else duration_s,
        fps=None if still or not rate else float(rate),
        rotation_deg=rotation,
        format_name=format_name,
    )


def _is_cover_art(stream: Any) -> bool:
    disposition = getattr(stream, "disposition", 0)
    attached = getattr(getattr(av.stream, "Disposition", None), "attached_pic", 0)
    return bool(attached and disposition & attached)


def _stream_rotation(container: Any, stream: Any) -> int:
    """Counter-clockwise degrees to display the frames upright (phone videos), from the first frame."""
    try:
        for frame in container.decode(stream):
            return int(round(getattr(frame, "rotation", 0) or 0)) % 360
    except av.FFmpegError:
        return 0
    return 0


def check_limits(info: MediaInfo, options: PrepareOptions) -> None:
    """Refuse inputs above the limits in ``options`` (uploads); :class:`InputLimitError` says which."""
    if options.max_input_side_px is not None and max(info.width, info.height) > options.max_input_side_px:
        raise InputLimitError(
            f"the input is {info.width}x{info.height}; at most {options.max_input_side_px} pixels a side"
        )
    if not options.truncate and info.duration_s is not None and info.duration_s > options.max_duration_s:
        raise InputLimitError(
            f"the video lasts {info.duration_s:.1f} s; at most {options.max_duration_s:g} s are accepted"
        )


def output_size(width: int, height: int, max_side_px: int) -> tuple[int, int]:
    """Avatar frame size: at most ``max_side_px`` on the longer side, never enlarged, even numbers."""
    scale = min(1.0, max_side_px / max(width, height))
    return max(2, 2 * round(width * scale / 2)), max(2, 2 * round(height * scale / 2))


def read_frames(path: Path, info: MediaInfo, options: PrepareOptions) -> Iterator[UInt8Array]:
    """The input's frames as RGB uint8 at the avatar's size and frame rate (one frame for an image)."""
    width, height = output_size(info.width, info.height, options.max_side_px)
    if info.kind == "image":
        yield _read_image(path, info, width, height)
        return
    step_s = 1.0 / options.fps
    limit = math.floor(options.max_duration_s * options.fps + 1e-6)
    count = 0
    try:
        with av.open(str(path)) as container:
            stream = next(s for s in container.streams.video if not _is_cover_art(s))
            stream.thread_type = "AUTO"
            frames = container.decode(stream)
            for source in _resample(frames, step_s):
                if count >= limit:
                    if not options.truncate:
                        raise InputLimitError(f"the video lasts more than {options.max_duration_s:g} s")
                    logger.info("%s: keeping the first %g s", path.name, options.max_duration_s)
                    return
                yield _to_rgb(source, info.rotation_deg, width, height)
                count += 1
    except av.FFmpegError as e:
        if count == 0:
            raise NotMediaError(f"{path.name}: cannot decode the video: {e}") from e
        logger.warning("%s: decoding stopped after %d frames: %s", path.name, count, e)
    if count == 0:
        raise NotMediaError(f"{path.name}: the video has no frames")


def _resample(frames: Iterator[Any], step_s: float) -> Iterator[Any]:
    """Nearest-frame resampling onto a grid of ``step_s`` from the first frame's time."""
    first_s: float | None = None
    previous: Any = None
    previous_s = 0.0
    index = 0
    source_step_s = step_s
    for frame in frames:
        t = frame.time if frame.time is not None else index * step_s
        first_s = t if first_s is None else first_s
        t -= first_s
        if previous is not None and t > previous_s:
            source_step_s = t - previous_s
        while index * step_s <= t:
            target = index * step_s
            nearer_previous = previous is not None and target - previous_s < t - target
            yield previous if nearer_previous else frame
            index += 1
        previous, previous_s = frame, t
    # The last frame lasts one source frame.
    while previous is not None and index * step_s < previous_s + source_step_s - 1e-6:
        yield previous
        index += 1


def _to_rgb(frame: Any, rotation_deg: int, width: int, height: int) -> UInt8Array:
    quarter_turns = (rotation_deg // 90) % 4
    scaled_w, scaled_h = (height, width) if quarter_turns % 2 else (width, height)
    image = frame.reformat(width=scaled_w, height=scaled_h, format="rgb24", interpolation="AREA")
    rgb = image.to_ndarray()
    return np.ascontiguousarray(np.rot90(rgb, quarter_turns)) if quarter_turns else rgb


def _read_image(path: Path, info: MediaInfo, width: int, height: int) -> UInt8Array:
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)  # applies the EXIF orientation of photos
    if bgr is None:  # a format OpenCV lacks but FFmpeg reads
        with av.open(str(path)) as container:
            frame = next(container.decode(video=0))
            return _to_rgb(frame, info.rotation_deg, width, height)
    if (bgr.shape[1], bgr.shape[0]) != (info.width, info.height):  # EXIF turned it
        width, height = output_size(bgr.shape[1], bgr.shape[0], max(width, height))
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(cv2.resize(rgb, (width, height), interpolation=cv2.INTER_AREA))


# -- tracking and smoothing ------------------------------------------------------------------------------


def first_face(path: Path, info: MediaInfo, options: PrepareOptions, detector: FaceDetector) -> None:
    """Raise :class:`NoFaceError` unless a face shows within the first second (a quick check for uploads)."""
    if options.box is not None:
        return
    for i, frame in enumerate(read_frames(path, info, options)):
        if detector.detect(frame):
            return
        if i + 1 >= FACE_CHECK_FRAMES:
            break
    raise NoFaceError(_no_face_message(path, "in its first second" if info.kind == "video" else ""))


def _no_face_message(path: Path, where: str) -> str:
    place = f" {where}" if where else ""
    return (
        f"no face found in {path.name}{place}: use a frontal, well-lit face, "
        "or give the face box by hand (--box) or a better detector model (--detector-model)"
    )


def prepare_avatar(
    input_path: Path,
    name: str,
    avatars_dir: Path,
    options: PrepareOptions | None = None,
    *,
    detector: FaceDetector | None = None,
    progress: Progress | None = None,
    overwrite: bool = False,
) -> Avatar:
    """Prepare ``input_path`` as avatar ``name`` in ``avatars_dir/name``; returns the loaded avatar.

    Raises :class:`PrepareError` subclasses for bad inputs; nothing is left behind on failure.
    """
    options = options or PrepareOptions()
    validate_name(name)
    destination = avatars_dir / name
    if destination.exists() and not overwrite:
        raise AvatarExistsError(f"avatar {name!r} exists already in {avatars_dir}")
    info = probe_media(input_path)
    check_limits(info, options)
    detector = detector or create_detector(options.detector_model)
    avatars_dir.mkdir(parents=True, exist_ok=True)
    work = avatars_dir / f".{name}.prep-{secrets.token_hex(4)}"
    (work / "frames").mkdir(parents=True)
    try:
        _prepare_into(work, input_path, name, info, options, detector, progress)
        if destination.exists():  # overwrite: swap the old one out first
            old = avatars_dir / f".{name}.old-{secrets.token_hex(4)}"
            os.rename(destination, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(work, destination)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return load_avatar(destination)


def _prepare_into(
    work: Path,
    input_path: Path,
    name: str,
    info: MediaInfo,
    options: PrepareOptions,
    detector: FaceDetector,
    progress: Progress | None,
) -> None:
    started_s = time.perf_counter()
    width, height = output_size(info.width, info.height, options.max_side_px)
    scale = width / info.width
    manual = None if options.box is None else box_detection([v * scale for v in options.box])
    expected = None
    if info.kind == "image":
        expected = 1
    elif info.duration_s is not None:
        expected = max(1, round(min(info.duration_s, options.max_duration_s) * options.fps))
    tracker = FaceTracker(detector)
    extension = "png" if info.kind == "image" else "jpg"
    files: list[str] = []
    rows: list[FloatArray] = []
    found = 0
    for index, frame in enumerate(read_frames(input_path, info, options)):
        detection = manual or tracker.find(frame)
        if detection is None:
            rows.append(np.full(GEOMETRY_SIZE, np.nan, np.float32))
            if found == 0 and index + 1 >= FACE_CHECK_FRAMES:
                raise NoFaceError(_no_face_message(input_path, "in its first second"))
        else:
            found += 1
            rows.append(face_geometry(detection))
        files.append(write_frame(work, index, frame, extension))
        if progress is not None:
            progress(index + 1, expected)
    if found == 0:
        raise NoFaceError(_no_face_message(input_path, ""))
    if found < MIN_FACE_SHARE * len(rows):
        raise NoFaceError(
            f"a face was found in only {found} of {len(rows)} frames of {input_path.name}: "
            "give the face box by hand (--box) or a better detector model (--detector-model)"
        )
    geometry = clamp_geometry(smooth_over_time(fill_gaps(np.stack(rows))), width, height)
    elapsed_s = time.perf_counter() - started_s
    write_manifest(
        work,
        name=name,
        fps=options.fps,
        width=width,
        height=height,
        frame_files=files,
        face_boxes=int_boxes(geometry[:, BOX], width, height),
        mouths=geometry[:, MOUTH],
        eyes=geometry[:, EYES],
        source=input_path.name,
        prepared={
            "detector": "manual box" if manual is not None else detector.name,
            "input": {
                "kind": info.kind,
                "width": info.width,
                "height": info.height,
                "duration_s": None if info.duration_s is None else round(info.duration_s, 3),
                "fps": None if info.fps is None else round(info.fps, 3),
            },
            "faces_found": found,
            "seconds": round(elapsed_s, 2),
        },
    )
    logger.info("avatar %r: %d frame(s) %dx%d, a face in %d", name, len(files), width, height, found)
