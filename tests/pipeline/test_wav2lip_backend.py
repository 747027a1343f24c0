from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lipcast.pipeline.avatar import Avatar, UnknownAvatarError
from lipcast.pipeline.backend import LipSyncBackend, RenderedPatch, RenderItem
from lipcast.pipeline.wav2lip.backend import Wav2LipBackend
from lipcast.pipeline.wav2lip.faces import crop_face_bgr, face_input, pad_boxes, prepare_face_inputs
from lipcast.pipeline.wav2lip.model import Wav2Lip
from lipcast.pipeline.wav2lip.paste import box_grid, face_mask, first_blended_row

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_avatar(
    name: str, frames: int, size_hw: tuple[int, int], box: tuple[int, ...], seed: int = 0
) -> Avatar:
    rng = np.random.default_rng(seed)
    height, width = size_hw
    pixels = rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    boxes = np.array([box] * frames, dtype=np.int32)
    boxes[1::2, :2] += 1  # boxes move a little between frames
    x1, y1, x2, y2 = box
    mouth = [x1 + 4, y2 - 12, x2 - 4, y2 - 12, y2 - 12, y2 - 3]
    return Avatar(name, 25, pixels, boxes, np.array([mouth] * frames, dtype=np.float32))


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(21)
    model = Wav2Lip()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.8, 1.2)
    return model.state_dict()


@pytest.fixture(scope="module")
def avatars() -> list[Avatar]:
    return [
        make_avatar("alpha", 3, (120, 110), (20, 15, 84, 85), seed=1),
        make_avatar("beta", 2, (90, 150), (60, 10, 110, 60), seed=2),
    ]


@pytest.fixture(scope="module")
def backend(weights: dict[str, torch.Tensor], avatars: list[Avatar]) -> Wav2LipBackend:
    backend = Wav2LipBackend(weights, batch_sizes=(1, 2, 4))
    for avatar in avatars:
        backend.add_avatar(avatar)
    return backend


def mel_window(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-4, 2, (80, 16)).astype(np.float32)


# -- face inputs ---------------------------------------------------------------------------------------------


def test_face_input_channels_mask_and_scale() -> None:
    rng = np.random.default_rng(3)
    frame = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
    box = (10, 5, 70, 55)
    face = crop_face_bgr(frame, box)
    resized_rgb = cv2.resize(frame[5:55, 10:70], (96, 96), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(face, resized_rgb[:, :, ::-1])
    x = face_input(face)
    assert x.shape == (6, 96, 96) and x.dtype == np.float32
    bgr = resized_rgb[:, :, ::-1].transpose(2, 0, 1).astype(np.float32) / np.float32(255)
    np.testing.assert_array_equal(x[3:], bgr)  # unmasked reference second
    np.testing.assert_array_equal(x[:3, :48], bgr[:, :48])  # masked copy first, upper half kept
    assert np.all(x[:3, 48:] == 0)  # rows 48..95 blacked out
    assert x[3:].max() <= 1.0


def test_face_pads_are_clipped_to_the_frame() -> None:
    boxes = np.array([[10, 5, 70, 55], [0, 0, 80, 58]], dtype=np.int32)
    out = pad_boxes(boxes, (0, 10, 2, 3), height=60, width=80)
    np.testing.assert_array_equal(out, [[8, 5, 73, 60], [0, 0, 80, 60]])


def test_prepare_face_inputs(avatars: list[Avatar]) -> None:
    inputs, boxes = prepare_face_inputs(avatars[0])
    assert inputs.shape == (3, 6, 96, 96)
    np.testing.assert_array_equal(boxes[:, 3], avatars[0].face_boxes[:, 3] + 10)  # default pads


# -- backend on the CPU --------------------------------------------------------------------------------------


def test_backend_protocol(backend: Wav2LipBackend) -> None:
    assert isinstance(backend, LipSyncBackend)
    assert backend.name == "wav2lip"
    assert backend.conditioning_shape == (80, 16)
    assert backend.lookahead_ms == 172.5
    assert backend.new_featurizer().lookahead_samples == 2760
    assert Wav2LipBackend(None, window_offset_frames=-1).lookahead_ms == 132.5


def test_render_places_patches_on_the_padded_boxes(backend: Wav2LipBackend, avatars: list[Avatar]) -> None:
    items = [
        RenderItem("alpha", 1, mel_window(1)),
        RenderItem("beta", 0, mel_window(2)),
        RenderItem("alpha", 2, mel_window(3)),
        RenderItem("beta", 1, mel_window(4)),
    ]
    patches = backend.render(items)
    assert len(patches) == 4
    for item, patch in zip(items, patches, strict=True):
        avatar = next(a for a in avatars if a.name == item.avatar)
        x1, y1, x2, y2 = pad_boxes(avatar.face_boxes, (0, 10, 0, 0), avatar.height, avatar.width)[
            item.frame_index
        ]
        row0 = first_blended_row(int(y2 - y1))
        assert (y2 - y1) * 0.4 < row0 < (y2 - y1) * 0.5  # about the lower half of the box
        assert (patch.top, patch.left) == (y1 + row0, x1)
        assert patch.pixels.shape == (y2 - y1 - row0, x2 - x1, 3) and patch.pixels.dtype == np.uint8
        original = avatar.frames[item.frame_index, y1 + row0 : y2, x1:x2]
        np.testing.assert_array_equal(patch.pixels[0], original[0])  # the blend starts below
        assert np.abs(patch.pixels.astype(int) - original).max() > 20  # the lower face changed


@pytest.mark.parametrize("top_fraction", [0.5, 0.3, 0.0])
def test_rows_above_the_patch_are_never_blended(top_fraction: float) -> None:
    mask = face_mask(top_fraction=top_fraction)
    for height in (20, 47, 96, 97, 150, 333, 720):
        geometry = torch.tensor([[height, 8.0, 0.0]])
        sampled = F.grid_sample(mask, box_grid(geometry, height, 8), align_corners=False)[0, 0, :, 0]
        row0 = first_blended_row(height, top_fraction)
        assert torch.all(sampled[:row0] == 0), height
        if top_fraction > 0:
            assert sampled[row0 + 2] > 0, height  # and no more than a row or two is kept back


def test_render_matches_a_cv2_reference(
    backend: Wav2LipBackend, weights: dict[str, torch.Tensor], avatars: list[Avatar]
) -> None:
    avatar = avatars[1]
    mel = mel_window(7)
    patch = backend.render([RenderItem(avatar.name, 1, mel)])[0]
    inputs, boxes = prepare_face_inputs(avatar)
    model = Wav2Lip().eval()
    model.load_state_dict(weights)
    with torch.no_grad():
        face = model(torch.from_numpy(mel)[None, None], torch.from_numpy(inputs[1:2]))[0]
    x1, y1, x2, y2 = boxes[1]
    size = (int(x2 - x1), int(y2 - y1))
    rgb = face.numpy()[::-1].transpose(1, 2, 0) * 255.0
    generated = cv2.resize(np.ascontiguousarray(rgb), size, interpolation=cv2.INTER_LINEAR)
    alpha = cv2.resize(face_mask()[0, 0].numpy(), size, interpolation=cv2.INTER_LINEAR)[..., None]
    base = avatar.frames[1, y1:y2, x1:x2].astype(np.float32)
    expected = np.clip(np.round(base + (generated - base) * alpha), 0, 255)
    row0 = patch.top - y1
    np.testing.assert_array_equal(expected[:row0], base[:row0])  # nothing above the patch changes
    difference = np.abs(patch.pixels.astype(np.float32) - expected[row0:])
    assert difference.max() <= 1.0
    assert (difference > 0).mean() < 0.01


def test_an_item_does_not_depend_on_the_rest_of_the_batch(backend: Wav2LipBackend) -> None:
    item = RenderItem("beta", 0, mel_window(9))
    alone = backend.render([item])[0]
    others = [RenderItem("alpha", i % 3, mel_window(10 + i)) for i in range(3)]
    for batch in ([item, *others], [*others, item]):
        patch = next(p for it, p in zip(batch, backend.render(batch), strict=True) if it is item)
        assert np.abs(patch.pixels.astype(int) - alone.pixels).max() <= 1


def test_unknown_avatar_frame_and_conditioning(backend: Wav2LipBackend) -> None:
    with pytest.raises(UnknownAvatarError):
        backend.render([RenderItem("gamma", 0, mel_window(0))])
    with pytest.raises(IndexError):
        backend.render([RenderItem("beta", 2, mel_window(0))])
    with pytest.raises(ValueError):
        backend.render([RenderItem("beta", 0, np.zeros((16, 80), np.float32))])


def test_remove_and_replace_avatars(weights: dict[str, torch.Tensor], avatars: list[Avatar]) -> None:
    backend = Wav2LipBackend(weights, batch_sizes=(1, 2))
    for avatar in avatars:
        backend.add_avatar(avatar)
    item = RenderItem("beta", 1, mel_window(5))
    before = backend.render([item])[0]
    backend.remove_avatar("alpha")
    after = backend.render([item])[0]
    np.testing.assert_array_equal(before.pixels, after.pixels)
    with pytest.raises(UnknownAvatarError):
        backend.render([RenderItem("alpha", 0, mel_window(5))])
    with pytest.raises(UnknownAvatarError):
        backend.remove_avatar("alpha")
    backend.add_avatar(avatars[1])  # replacing keeps one copy
    assert backend.render([item])[0].pixels.shape == before.pixels.shape
    assert set(backend.warmup()) == {1, 2}


# -- backend on CUDA (skipped without a GPU) -----------------------------------------------------------------


def assert_close_to_cpu(got: list[RenderedPatch], want: list[RenderedPatch]) -> None:
    """fp16 on the GPU against fp32 on the CPU: a few levels at most, rarely any."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.top, g.left) == (w.top, w.left)
        assert g.pixels.shape == w.pixels.shape
        difference = np.abs(g.pixels.astype(int) - w.pixels)
        assert difference.max() <= 8 and difference.mean() < 0.5


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_cuda_render_matches_cpu(
    cuda_graphs: bool, backend: Wav2LipBackend, weights: dict[str, torch.Tensor], avatars: list[Avatar]
) -> None:
    cuda = Wav2LipBackend(weights, device="cuda", batch_sizes=(1, 2, 4), cuda_graphs=cuda_graphs)
    assert cuda.dtype == torch.float16
    for avatar in avatars:
        cuda.add_avatar(avatar)
    timings = cuda.warmup()
    assert set(timings) == {1, 2, 4} and all(ms > 0 for ms in timings.values())
    items = [RenderItem(avatars[i % 2].name, i % 2, mel_window(30 + i)) for i in range(4)]
    for batch in (items, items[:1], items[1:2], items[:3]):  # 3 is no bucket: the eager path
        assert_close_to_cpu(cuda.render(batch), backend.render(batch))
    first = cuda.render(items)
    kept = [p.pixels.copy() for p in first]
    cuda.render([RenderItem(i.avatar, i.frame_index, mel_window(90 + n)) for n, i in enumerate(items)])
    for patch, pixels in zip(first, kept, strict=True):  # a later batch does not overwrite earlier patches
        np.testing.assert_array_equal(patch.pixels, pixels)
    second = cuda.render(items)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a.pixels, b.pixels)
    alone = cuda.render(items[1:2])[0]
    # padding-independent on the GPU too (cuDNN may pick another algorithm per batch size: 1 level)
    assert np.abs(alone.pixels.astype(int) - first[1].pixels).max() <= 1


@pytest.mark.gpu
@requires_cuda
def test_cuda_canvas_growth_and_removal(weights: dict[str, torch.Tensor], avatars: list[Avatar]) -> None:
    wide = make_avatar("wide", 2, (220, 240), (10, 10, 230, 200), seed=4)
    cpu = Wav2LipBackend(weights, batch_sizes=(1, 2))
    cuda = Wav2LipBackend(weights, device="cuda", batch_sizes=(1, 2))
    for avatar in avatars:
        cpu.add_avatar(avatar)
        cuda.add_avatar(avatar)
    items = [RenderItem("alpha", 0, mel_window(50)), RenderItem("beta", 1, mel_window(51))]
    assert_close_to_cpu(cuda.render(items), cpu.render(items))  # captures at the small canvas
    cpu.add_avatar(wide)
    cuda.add_avatar(wide)  # a larger canvas: graphs are captured again on next use
    mixed = [RenderItem("wide", 1, mel_window(52)), items[1]]
    assert_close_to_cpu(cuda.render(mixed), cpu.render(mixed))
    cpu.remove_avatar("alpha")
    cuda.remove_avatar("alpha")  # tables shrink under the captured graphs
    assert_close_to_cpu(cuda.render(mixed), cpu.render(mixed))
