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


def diffs(got: list[np.ndarray], expected: list[np.ndarray]) -> tuple[list[int], list[float]]:
    pairs = [(a.astype(int), b.astype(int)) for a, b in zip(got, expected, strict=True)]
    return [int(np.abs(a - b).max()) for a, b in pairs], [float(np.abs(a - b).mean()) for a, b in pairs]


def test_engine_graphs_render_what_eager_renders_and_the_fp16_check_passes(models: MuseTalkModels) -> None:
    """The graphs replay the eager computation: against the same backend's eager path (the same kernels,
    as cuDNN's autotuning picked them) they agree to one level. Against another eager backend the kernels
    may differ (cuDNN's choice per run, fp16 accumulation orders): there the graphs must be as close to the
    fp32 render as an eager fp16 render is (the fp16 noise is the tolerance, not a fixed number of levels)."""
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
    got = [p.pixels.copy() for p in graphed.render(items)]
    rows = np.array([graphed._avatars["gpu"].offset + i for i in range(4)], dtype=np.int64)
    same_kernels = list(graphed._render_eager(rows, items))
    own = diffs(got, [c[: g.shape[0], : g.shape[1]] for c, g in zip(same_kernels, got, strict=True)])
    other = diffs(got, expected)
    oracle = MuseTalkBackend(
        models=random_models(full_configs(), seed=0),
        device="cuda",
        dtype=torch.float32,
        batch_sizes=(4,),
        cuda_graphs=False,
        check_fp16_range=False,
    )
    oracle.add_avatar(avatar)
    fp32 = [p.pixels for p in oracle.render(items)]
    graph_err, eager_err = diffs(got, fp32)[1], diffs(expected, fp32)[1]
    print(
        f"graph vs eager (same backend): max {own[0]}, mean {own[1]}; vs another eager backend: max"
        f" {other[0]}, mean {other[1]}; mean |difference| from fp32: graph {graph_err}, eager {eager_err}"
    )
    assert max(own[0]) <= 1, own
    assert max(graph_err) <= 1.5 * max(eager_err) + 0.25, (graph_err, eager_err)
    single = graphed.render(items[2:3])[0]
    assert np.abs(single.pixels.astype(int) - got[2].astype(int)).mean() <= 1.5 * max(eager_err) + 0.25
