from __future__ import annotations

import pytest
import torch

from lipcast.pipeline.wav2lip.fold import fold_batchnorm
from lipcast.pipeline.wav2lip.fused import FusedConvUnit, fuse_conv_units
from lipcast.pipeline.wav2lip.model import ConvUnit, Wav2Lip

gpu = pytest.mark.gpu


def randomised_model(seed: int = 0) -> Wav2Lip:
    torch.manual_seed(seed)
    model = Wav2Lip()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # non-trivial statistics, so the fold matters
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def test_every_conv_unit_is_replaced_and_the_output_is_unchanged_on_cpu() -> None:
    folded = fold_batchnorm(randomised_model())
    fused = fuse_conv_units(folded)
    assert not any(isinstance(m, ConvUnit) for m in fused.modules())
    assert sum(isinstance(m, FusedConvUnit) for m in fused.modules()) == sum(
        isinstance(m, ConvUnit) for m in folded.modules()
    )
    audio, face = torch.randn(2, 1, 80, 16), torch.rand(2, 6, 96, 96)
    with torch.no_grad():
        torch.testing.assert_close(fused(audio, face), folded(audio, face), rtol=0, atol=0)


def test_an_unfolded_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="BN-folded"):
        FusedConvUnit(ConvUnit(4, 4, 3, 1, 1))


@gpu
def test_fused_cuda_output_matches_eager_fp32() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    folded = fold_batchnorm(randomised_model()).cuda()
    fused = fuse_conv_units(folded)
    audio, face = torch.randn(4, 1, 80, 16, device="cuda"), torch.rand(4, 6, 96, 96, device="cuda")
    with torch.no_grad():
        # fp32 on both sides; cuDNN may pick other algorithms for the fused call (TF32 off by default)
        torch.testing.assert_close(fused(audio, face), folded(audio, face), rtol=1e-3, atol=1e-4)
