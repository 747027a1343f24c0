from __future__ import annotations

import pytest
import torch
from torch import nn

from lipcast.pipeline.wav2lip.fold import fold_batchnorm
from lipcast.pipeline.wav2lip.model import FACE_FEATURE_SHAPES, ConvUnit, Wav2Lip


def randomize_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial BN statistics and affine parameters, so that folding and eval mode matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
                m.num_batches_tracked.fill_(7)
    return model.eval()


@pytest.fixture(scope="module")
def model() -> Wav2Lip:
    torch.manual_seed(0)
    return randomize_batchnorm(Wav2Lip())


def inputs(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    audio = torch.rand(n, 1, 80, 16, generator=gen) * 8 - 4
    face = torch.rand(n, 6, 96, 96, generator=gen)
    face[:, :3, 48:] = 0
    return audio, face


def test_parameter_count_names_and_shapes(model: Wav2Lip) -> None:
    state = model.state_dict()
    assert len(state) == 352
    assert sum(p.numel() for p in model.parameters()) == 36_298_035
    parts = {
        "face_encoder_blocks": 8_171_056,
        "audio_encoder": 2_812_672,
        "face_decoder_blocks": 25_291_072,
        "output_block": 23_235,
    }
    for prefix, count in parts.items():
        assert sum(p.numel() for k, p in model.named_parameters() if k.startswith(prefix)) == count
    buffers = sum(b.numel() for b in model.buffers())
    assert buffers == 22_802
    expected = {
        "face_encoder_blocks.0.0.conv_block.0.weight": (16, 6, 7, 7),
        "face_encoder_blocks.6.0.conv_block.0.weight": (512, 512, 3, 3),
        "face_encoder_blocks.6.1.conv_block.0.weight": (512, 512, 1, 1),
        "audio_encoder.3.conv_block.0.weight": (64, 32, 3, 3),
        "audio_encoder.12.conv_block.1.running_var": (512,),
        "face_decoder_blocks.0.0.conv_block.0.weight": (512, 512, 1, 1),
        "face_decoder_blocks.1.0.conv_block.0.weight": (1024, 512, 3, 3),  # ConvT: (cin, cout, k, k)
        "face_decoder_blocks.2.0.conv_block.0.weight": (1024, 512, 3, 3),
        "face_decoder_blocks.5.0.conv_block.0.weight": (320, 128, 3, 3),
        "face_decoder_blocks.6.2.conv_block.1.num_batches_tracked": (),
        "output_block.0.conv_block.0.weight": (32, 80, 3, 3),
        "output_block.1.weight": (3, 32, 1, 1),
        "output_block.1.bias": (3,),
    }
    for key, shape in expected.items():
        assert tuple(state[key].shape) == shape, key
    assert state["audio_encoder.0.conv_block.1.num_batches_tracked"].dtype == torch.int64
    assert not any(k.startswith("module.") or ".act." in k for k in state)


def test_layer_hyperparameters_from_the_spec(model: Wav2Lip) -> None:
    audio = model.audio_encoder
    assert [audio[i].conv_block[0].stride for i in (3, 6, 9)] == [(3, 1), (3, 3), (3, 2)]
    first_up = model.face_decoder_blocks[1][0].conv_block[0]
    assert isinstance(first_up, nn.ConvTranspose2d)
    assert (first_up.stride, first_up.padding, first_up.output_padding) == ((1, 1), (0, 0), (0, 0))
    for b in range(2, 7):
        up = model.face_decoder_blocks[b][0].conv_block[0]
        assert (up.stride, up.padding, up.output_padding) == ((2, 2), (1, 1), (1, 1))
    assert isinstance(model.output_block[2], nn.Sigmoid)


def test_feature_shapes(model: Wav2Lip) -> None:
    audio, face = inputs(2)
    with torch.no_grad():
        feats = model.encode_face(face)
        emb = model.encode_audio(audio)
        out = model(audio, face)
    assert [tuple(f.shape[1:]) for f in feats] == list(FACE_FEATURE_SHAPES)
    assert emb.shape == (2, 512, 1, 1)
    assert out.shape == (2, 3, 96, 96)
    assert 0 < out.min() and out.max() < 1


def test_cached_features_equal_full_forward(model: Wav2Lip) -> None:
    audio, face = inputs(2)
    with torch.no_grad():
        full = model(audio, face)
        feats = [f.clone() for f in model.encode_face(face)]
        cached = model.decode(model.encode_audio(audio), feats)
        again = model.decode(model.encode_audio(audio), feats)  # decode leaves the cache intact
    assert (cached - full).abs().max() <= 1e-4
    assert torch.equal(cached, again)


def test_folded_batchnorm_matches_eval_model(model: Wav2Lip) -> None:
    folded = fold_batchnorm(model)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # original untouched
    audio, face = inputs(2, seed=3)
    with torch.no_grad():
        reference = model(audio, face)
        out = folded(audio, face)
        feats = folded.encode_face(face)
        reference_feats = model.encode_face(face)
    assert (out - reference).abs().max() <= 1e-4
    for f, r in zip(feats, reference_feats, strict=True):
        assert (f - r).abs().max() <= 1e-4 * max(1.0, float(r.abs().max()))


@pytest.mark.parametrize("transposed", [False, True])
def test_fold_uses_the_output_channel_axis(transposed: bool) -> None:
    torch.manual_seed(5)
    conv: nn.Module = nn.ConvTranspose2d(4, 6, 3, 2, 1, 1) if transposed else nn.Conv2d(4, 6, 3, 1, 1)
    seq = randomize_batchnorm(nn.Sequential(conv, nn.BatchNorm2d(6)), seed=2)
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        assert (fold_batchnorm(seq)(x) - seq(x)).abs().max() <= 1e-5


def test_five_dimensional_training_form_is_per_frame(model: Wav2Lip) -> None:
    audio, face = inputs(4, seed=4)  # B=2, T=2, flattened time-major
    audio5 = torch.stack((audio[:2], audio[2:]), dim=1)  # (B, T, 1, 80, 16)
    face5 = torch.stack((face[:2], face[2:]), dim=2)  # (B, 6, T, 96, 96)
    with torch.no_grad():
        out5 = model(audio5, face5)
        out4 = model(audio, face)
    assert out5.shape == (2, 3, 2, 96, 96)
    assert (out5[:, :, 0] - out4[:2]).abs().max() <= 1e-5
    assert (out5[:, :, 1] - out4[2:]).abs().max() <= 1e-5


def test_batch_elements_are_independent_in_eval(model: Wav2Lip) -> None:
    audio, face = inputs(3, seed=6)
    with torch.no_grad():
        alone = model(audio[:1], face[:1])
        batched = model(audio, face)
    assert (alone - batched[:1]).abs().max() <= 1e-5


def test_skip_concatenation_puts_decoder_output_first(model: Wav2Lip) -> None:
    audio, face = inputs(1, seed=7)
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        model.face_decoder_blocks[0].register_forward_hook(lambda m, i, o: seen.__setitem__("block0", o)),
        model.face_decoder_blocks[1].register_forward_pre_hook(
            lambda m, i: seen.__setitem__("block1_in", i[0])
        ),
    ]
    try:
        with torch.no_grad():
            model(audio, face)
            feats = model.encode_face(face)
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.equal(seen["block1_in"][:, :512], seen["block0"])
    assert torch.equal(seen["block1_in"][:, 512:], feats[6])


def test_residual_add_is_after_batchnorm_before_relu() -> None:
    torch.manual_seed(8)
    unit = randomize_batchnorm(ConvUnit(4, 4, 3, 1, 1, residual=True))
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        expected = torch.relu(unit.conv_block[1](unit.conv_block[0](x)) + x)
        assert torch.equal(unit(x), expected)


def test_mel_orientation_matters(model: Wav2Lip) -> None:
    with pytest.raises(RuntimeError), torch.no_grad():
        model.encode_audio(torch.zeros(1, 1, 16, 80))  # time x mel instead of mel x time
