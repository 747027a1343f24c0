"""MuseTalk at full size on a GPU (spec 8 with the published configuration, random weights): fp16 against an
fp32 oracle, batch independence, the CUDA graphs against eager rendering, the fp16 check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.musetalk.backend import MuseTalkBackend
from lipcast.pipeline.musetalk.config import full_configs
from lipcast.pipeline.musetalk.weights import MuseTalkModels, random_models
from lipcast.pipeline.wav2lip.bench import synthetic_avatar

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(scope="module")
def models() -> MuseTalkModels:
    return random_models(full_configs(), seed=0)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_unet_fp16_against_the_fp32_oracle_and_batch_independence(models: MuseTalkModels) -> None:
    torch.manual_seed(0)
    latents = torch.randn(20, 8, 32, 32, device="cuda") * 0.8
    context = torch.randn(20, 50, 384, device="cuda")
    t = torch.zeros(20, dtype=torch.long, device="cuda")
    unet = models.unet.to("cuda")
    with torch.no_grad():
        oracle = unet.float()(latents, t, encoder_hidden_states=context).sample
        half = unet.half()
        fp16 = half(latents.half(), t, encoder_hidden_states=context.half()).sample
        one = half(latents[7:8].half(), t[:1], encoder_hidden_states=context[7:8].half()).sample
    unet.float().cpu()
    print(f"unet fp16 vs fp32 relative L2: {rel(fp16, oracle):.2e}; b1 vs b20: {rel(one, fp16[7:8]):.2e}")
    assert rel(fp16, oracle) < 2e-3
    assert rel(one, fp16[7:8]) < 2e-3


def test_engine_graphs_render_what_eager_renders_and_the_fp16_check_passes(models: MuseTalkModels) -> None:
    avatar = synthetic_avatar("gpu", frames=4)
    eager = MuseTalkBackend(models=models, device="cuda", batch_sizes=(1, 4), cuda_graphs=False)
    eager.add_avatar(avatar)
    report = eager.check_fp16()
    assert eager.dtype == torch.float16 and report["max_abs"] < 32752, report
    cond = eager.speech_conditioning()
    items = [RenderItem("gpu", i, cond) for i in range(4)]
    expected = [p.pixels.copy() for p in eager.render(items)]
    graphed = MuseTalkBackend(models=models, device="cuda", batch_sizes=(1, 4))
    graphed.add_avatar(avatar)
    graphed.warmup()
    got = graphed.render(items)
    gaps = [
        int(np.abs(a.pixels.astype(int) - b.astype(int)).max()) for a, b in zip(got, expected, strict=True)
    ]
    means = [
        float(np.abs(a.pixels.astype(int) - b.astype(int)).mean()) for a, b in zip(got, expected, strict=True)
    ]
    print(f"graph vs eager: max |difference| per item {gaps}, mean {means}")
    assert max(gaps) <= 2, (gaps, means)
    single = graphed.render(items[2:3])[0]
    assert np.abs(single.pixels.astype(int) - expected[2].astype(int)).max() <= 2
