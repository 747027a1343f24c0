"""fp16 safety: a checked fp32 pass finds activations beyond the float16 range; the backend falls back."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.wav2lip.backend import Wav2LipBackend
from lipcast.pipeline.wav2lip.faces import prepare_face_inputs
from lipcast.pipeline.wav2lip.model import Wav2Lip
from lipcast.pipeline.wav2lip.range_check import FP16_MAX, activation_peaks, check_fp16_range, probe_mels
from tests.pipeline.test_wav2lip_backend import make_avatar


def scaled_weights(factor: float) -> dict[str, torch.Tensor]:
    """Random weights with one decoder convolution scaled by ``factor`` (its outputs scale with it)."""
    torch.manual_seed(3)
    model = Wav2Lip()
    with torch.no_grad():
        model.face_decoder_blocks[3][1].conv_block[0].weight.mul_(factor)
    return model.state_dict()


@pytest.fixture(scope="module")
def avatar():  # type: ignore[no-untyped-def]
    return make_avatar("alpha", 3, (120, 110), (20, 15, 84, 85), seed=1)


def test_peaks_cover_every_conv_and_match_a_direct_pass(avatar) -> None:  # type: ignore[no-untyped-def]
    model = Wav2Lip().eval()
    faces = torch.from_numpy(prepare_face_inputs(avatar)[0])
    mels = probe_mels(3)
    peaks = activation_peaks(model, faces, mels)
    convs = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d | torch.nn.ConvTranspose2d)]
    assert set(peaks) == set(convs)
    # The last conv's peak equals max |logit| of a direct pass (the sigmoid's input).
    captured = {}
    handle = model.output_block[1].register_forward_hook(lambda m, i, o: captured.update(out=o))
    with torch.no_grad():
        model.decode(model.encode_audio(mels[torch.arange(3) % 3]), model.encode_face(faces))
    handle.remove()
    assert peaks["output_block.1"] == pytest.approx(float(captured["out"].abs().max()), rel=1e-5)


def test_normal_weights_fit_and_scaled_weights_do_not(avatar) -> None:  # type: ignore[no-untyped-def]
    faces = torch.from_numpy(prepare_face_inputs(avatar)[0])
    normal = Wav2Lip().eval()
    normal.load_state_dict(scaled_weights(1.0))
    report = check_fp16_range(normal, faces, probe_mels())
    assert report.fits_fp16 and 0 < report.peak < report.limit
    hot = Wav2Lip().eval()
    hot.load_state_dict(scaled_weights(1e8))
    report = check_fp16_range(hot, faces, probe_mels())
    assert not report.fits_fp16
    assert report.peak > FP16_MAX  # it would overflow (inf) in fp16, while fp32 still holds it
    assert report.layer.startswith("face_decoder_blocks.3")


def test_backend_falls_back_to_fp32_with_a_log_line(avatar, caplog) -> None:  # type: ignore[no-untyped-def]
    backend = Wav2LipBackend(scaled_weights(1e8), dtype=torch.float16, batch_sizes=(1, 2))
    assert backend.dtype == torch.float16
    with caplog.at_level(logging.WARNING, logger="lipcast.pipeline.wav2lip.range_check"):
        backend.add_avatar(avatar)
    assert backend.dtype == torch.float32
    assert next(backend.model.parameters()).dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in backend._feats)
    assert not backend.range_reports["alpha"].fits_fp16
    assert any("falling back to fp32" in r.getMessage() for r in caplog.records)
    mel = np.full((80, 16), -4.0, np.float32)
    patches = backend.render([RenderItem("alpha", 0, mel)])  # it renders, in fp32
    assert patches[0].pixels.dtype == np.uint8


def test_backend_keeps_fp16_when_it_fits(avatar) -> None:  # type: ignore[no-untyped-def]
    backend = Wav2LipBackend(scaled_weights(1.0), dtype=torch.float16, batch_sizes=(1,))
    backend.add_avatar(avatar)
    assert backend.dtype == torch.float16 and backend.range_reports["alpha"].fits_fp16


def test_fp32_backend_is_not_checked(avatar) -> None:  # type: ignore[no-untyped-def]
    backend = Wav2LipBackend(scaled_weights(1e8), batch_sizes=(1,))  # CPU: fp32 already
    backend.add_avatar(avatar)
    assert backend.range_reports == {}
