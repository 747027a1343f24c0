"""Avatar preparation from generated inputs: a drawn face video, a still, the astronaut photo moving."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lipcast.cli import main
from lipcast.pipeline.avatar import MANIFEST_NAME, AvatarError, load_avatar
from lipcast.pipeline.avatar_prepare import (
    AvatarExistsError,
    InputLimitError,
    NoFaceError,
    NotMediaError,
    PrepareOptions,
    fill_gaps,
    output_size,
    prepare_avatar,
    probe_media,
    smooth_over_time,
)
from lipcast.pipeline.face_detect import HaarFaceDetector, face_geometry
from tests.pipeline.face_media import (
    astronaut_frames,
    drawn_face,
    drawn_face_frames,
    encode_video,
    write_image,
)

DRAWN_FRAMES = 20


@pytest.fixture(scope="module")
def drawn_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return encode_video(tmp_path_factory.mktemp("media") / "drawn.mp4", drawn_face_frames(DRAWN_FRAMES))


@pytest.fixture(scope="module")
def blank_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    frames = [np.full((96, 128, 3), 90 + k, np.uint8) for k in range(30)]
    return encode_video(tmp_path_factory.mktemp("media") / "blank.mp4", frames)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_haar_finds_the_drawn_face_and_proportions_place_its_parts() -> None:
    # The drawn face: eyes at (67, 68) and (93, 68), mouth corners at x 68..92, y 102, chin at y 122.
    detections = HaarFaceDetector().detect(drawn_face())
    assert len(detections) == 1
    geometry = face_geometry(detections[0])
    box, mouth, eyes = geometry[:4], geometry[4:10], geometry[10:]
    assert box[0] < 60 and box[2] > 100 and box[1] < 60 and box[3] >= 118
    assert abs((mouth[0] + mouth[2]) / 2 - 80) < 4 and abs(mouth[1] - 102) < 5 and abs(mouth[5] - 122) < 8
    assert abs(eyes[0] - 67) < 5 and abs(eyes[2] - 93) < 8 and abs(eyes[1] - 68) < 5


def test_prepare_a_drawn_face_video(drawn_video: Path, tmp_path: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    avatar = prepare_avatar(drawn_video, "drawn", tmp_path, progress=lambda d, t: seen.append((d, t)))
    assert avatar.name == "drawn" and avatar.frame_count == DRAWN_FRAMES
    assert (avatar.width, avatar.height) == (160, 160)
    assert seen[-1] == (DRAWN_FRAMES, DRAWN_FRAMES)
    assert leftovers(tmp_path) == ["drawn"]  # no work directory left
    manifest = json.loads((tmp_path / "drawn" / MANIFEST_NAME).read_text())
    assert manifest["version"] == 1 and manifest["prepared"]["faces_found"] == DRAWN_FRAMES
    assert len(manifest["eyes"]) == DRAWN_FRAMES and manifest["frames"][0].endswith(".jpg")
    # The face drifts by 4 px over the clip: the smoothed boxes follow it without jumping.
    centres = (avatar.face_boxes[:, 0] + avatar.face_boxes[:, 2]) / 2
    assert np.abs(np.diff(centres)).max() <= 3
    assert 4 <= np.ptp((avatar.mouths[:, 0] + avatar.mouths[:, 2]) / 2) <= 12
    assert np.abs(avatar.mouths[:, 1] - 102).max() < 8
    again = load_avatar(tmp_path / "drawn")
    np.testing.assert_array_equal(again.mouths, avatar.mouths)


def test_prepare_a_still_image(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "face.png", drawn_face())
    assert probe_media(photo).kind == "image"
    avatar = prepare_avatar(photo, "still", tmp_path / "avatars")
    assert avatar.frame_count == 1 and avatar.eyes is not None
    assert json.loads((tmp_path / "avatars/still" / MANIFEST_NAME).read_text())["frames"] == [
        "frames/000000.png"
    ]
    # The still frame is the picture itself.
    np.testing.assert_array_equal(avatar.frames[0], drawn_face())


def test_prepare_resamples_to_25_fps_and_scales_large_frames(tmp_path: Path) -> None:
    frames = astronaut_frames(30, 480, 360)  # 1 s at 30 fps
    video = encode_video(tmp_path / "astro30.mp4", frames, fps=30)
    avatar = prepare_avatar(video, "astro", tmp_path / "avatars", PrepareOptions(max_side_px=240))
    assert avatar.frame_count == 25
    assert (avatar.width, avatar.height) == (240, 180) == output_size(480, 360, 240)
    # The photo's annotated mouth (left corner 139, 140.5 at scale 1) lands near where it was drawn.
    scale = 240 / 480
    expected_x = (480 / 2 - 160 + 139 + 10 * 0) * scale
    assert abs(avatar.mouths[0, 0] - expected_x) < 10


def test_manual_box_for_a_face_the_detector_misses(blank_video: Path, tmp_path: Path) -> None:
    with pytest.raises(NoFaceError, match="no face found"):
        prepare_avatar(blank_video, "blank", tmp_path)
    assert leftovers(tmp_path) == []
    avatar = prepare_avatar(blank_video, "blank", tmp_path, PrepareOptions(box=(40, 10, 90, 80)))
    x1, y1, x2, y2 = avatar.face_boxes[0]
    assert (x1, x2) == (40, 90) and 78 <= y2 <= 84  # a little below the chin, as detected boxes
    assert avatar.mouths[0, 5] == pytest.approx(80, abs=1)  # the chin at the box's bottom


@pytest.mark.parametrize(
    ("content", "suffix"),
    [(b"just some text, not a video\n" * 20, ".mp4"), (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, ".png")],
)
def test_not_a_video_or_image(tmp_path: Path, content: bytes, suffix: str) -> None:
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(content)
    with pytest.raises(NotMediaError):
        prepare_avatar(path, "bad", tmp_path / "avatars")
    assert leftovers(tmp_path / "avatars") == []


def test_names_and_existing_avatars(drawn_video: Path, tmp_path: Path) -> None:
    for bad in ("../escape", "a/b", "Upper", "", ".hidden"):
        with pytest.raises(AvatarError, match="invalid avatar name"):
            prepare_avatar(drawn_video, bad, tmp_path)
    prepare_avatar(drawn_video, "taken", tmp_path, PrepareOptions(max_duration_s=0.2))
    with pytest.raises(AvatarExistsError):
        prepare_avatar(drawn_video, "taken", tmp_path)
    replaced = prepare_avatar(drawn_video, "taken", tmp_path, overwrite=True)
    assert replaced.frame_count == DRAWN_FRAMES
    assert leftovers(tmp_path) == ["taken"]


def test_duration_and_resolution_limits(drawn_video: Path, tmp_path: Path) -> None:
    truncated = prepare_avatar(drawn_video, "short", tmp_path, PrepareOptions(max_duration_s=0.4))
    assert truncated.frame_count == 10
    with pytest.raises(InputLimitError, match="at most 0.4 s"):
        prepare_avatar(drawn_video, "long", tmp_path, PrepareOptions(max_duration_s=0.4, truncate=False))
    with pytest.raises(InputLimitError, match="at most 100 pixels"):
        prepare_avatar(drawn_video, "big", tmp_path, PrepareOptions(max_input_side_px=100))
    assert leftovers(tmp_path) == ["short"]


def test_smoothing_fills_gaps_and_drops_outliers() -> None:
    track = np.tile(np.arange(12, dtype=np.float32)[:, None], (1, 2))
    track[5] = np.nan
    filled = fill_gaps(track)
    assert filled[5, 0] == pytest.approx(5.0)
    track = np.full((15, 1), 50.0, np.float32)
    track[7] = 90.0  # a one-frame false detection
    assert np.abs(smooth_over_time(track) - 50.0).max() < 1e-4
    with pytest.raises(NoFaceError):
        fill_gaps(np.full((3, 2), np.nan, np.float32))


def test_cli_prepares_and_reports_errors(
    drawn_video: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "avatars"
    argv = ["avatar", "prepare", str(drawn_video), "--name", "cli", "--out", str(out), "--max-seconds", "0.4"]
    assert main(argv) == 0
    assert load_avatar(out / "cli").frame_count == 10
    assert "lipcast serve --avatar-dir" in capsys.readouterr().out
    assert main(argv) == 1
    assert "exists already" in capsys.readouterr().err
    assert main(["avatar", "prepare", str(tmp_path / "missing.mp4"), "--name", "x", "--out", str(out)]) == 1
    assert "does not exist" in capsys.readouterr().err


class FakeYuNet:
    """What ``cv2.FaceDetectorYN`` returns: rows of box, 5 landmarks (subject's right eye first), score."""

    row = np.array(
        [[40, 30, 80, 90, 100, 60, 70, 61, 85, 80, 98, 100, 72, 101, 0.93]], np.float32
    )  # x, y, w, h, right eye, left eye, nose, right mouth corner, left mouth corner, score

    @classmethod
    def create(cls, *args: object) -> FakeYuNet:
        return cls()

    def setInputSize(self, size: tuple[int, int]) -> None:  # noqa: N802 (OpenCV's name)
        self.size = size

    def detect(self, image: np.ndarray) -> tuple[int, np.ndarray]:
        return 1, self.row


def test_yunet_landmarks_give_eyes_and_mouth(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import cv2

    from lipcast.pipeline.face_detect import YuNetFaceDetector, create_detector

    model = tmp_path / "yunet.onnx"
    model.write_bytes(b"onnx")
    monkeypatch.setattr(cv2, "FaceDetectorYN", FakeYuNet)
    detector = create_detector(model)
    assert isinstance(detector, YuNetFaceDetector)
    (face,) = detector.detect(np.zeros((160, 160, 3), np.uint8))
    assert face.box == (40.0, 30.0, 120.0, 120.0) and face.score == pytest.approx(0.93)
    geometry = face_geometry(face)
    mouth, eyes = geometry[4:10], geometry[10:]
    np.testing.assert_allclose(eyes, [70, 61, 100, 60])  # sorted left to right in the frame
    np.testing.assert_allclose(mouth[:4], [72, 101, 98, 100])
    assert 100.5 < mouth[4] < 104 and mouth[5] > mouth[4] + 10  # lip line just below the corners, then chin
    with pytest.raises(AvatarError, match="not found"):
        create_detector(tmp_path / "missing.onnx")
