"""fp16 safety: the largest activation of every layer on real inputs, against the float16 range.

The published checkpoints were trained in fp32; nothing guarantees that their activations stay inside
float16 (largest finite value 65,504) on every avatar. Before the backend renders an avatar in fp16 it runs
the BN-folded model once in **fp32** on that avatar's own face inputs (and a spread of mel windows), with a
forward hook on every convolution that records max |output|. If any layer comes within
:data:`FP16_HEADROOM` of the float16 limit (or is not finite), fp16 is not safe and the backend falls back to
fp32 with a warning. The headroom covers what one pass cannot see: other audio, and fp16 rounding that adds
up over 50 layers (observed ratios on random weights are far below it).
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from lipcast.pipeline.wav2lip.model import Wav2Lip

logger = logging.getLogger(__name__)

FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504
FP16_HEADROOM = 8.0  # a layer may reach FP16_MAX / 8 (8,188) and still count as safe
RANGE_CHECK_FRAMES = 64  # avatar frames (evenly spread) in one avatar's check


@dataclass(frozen=True)
class RangeReport:
    """The largest |activation| seen, and where."""

    peak: float
    layer: str
    limit: float

    @property
    def fits_fp16(self) -> bool:
        return math.isfinite(self.peak) and self.peak <= self.limit


@torch.no_grad()
def activation_peaks(
    model: Wav2Lip, faces: torch.Tensor, mels: torch.Tensor, *, batch: int = 32
) -> dict[str, float]:
    """max |output| of every conv layer of ``model`` run in fp32 on ``faces`` (N, 6, 96, 96) and ``mels``
    (M, 1, 80, 16) (each face paired with mels in turn). ``model`` itself is not changed."""
    checked = copy.deepcopy(model).float().eval()
    device = next(checked.parameters()).device
    peaks: dict[str, float] = {}
    hooks = []

    def hook(name: str) -> object:
        def record(_module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
            peak = float(output.detach().abs().amax()) if output.numel() else 0.0
            if math.isnan(peak):
                peak = math.inf
            peaks[name] = max(peaks.get(name, 0.0), peak)

        return record

    for name, module in checked.named_modules():
        if isinstance(module, nn.Conv2d | nn.ConvTranspose2d):
            hooks.append(module.register_forward_hook(hook(name)))  # type: ignore[arg-type]
    try:
        for start in range(0, faces.shape[0], batch):
            face = faces[start : start + batch].to(device, torch.float32)
            index = torch.arange(start, start + face.shape[0]) % mels.shape[0]
            mel = mels[index].to(device, torch.float32)
            checked.decode(checked.encode_audio(mel), checked.encode_face(face))
    finally:
        for handle in hooks:
            handle.remove()
    return peaks


def check_fp16_range(
    model: Wav2Lip, faces: torch.Tensor, mels: torch.Tensor, headroom: float = FP16_HEADROOM
) -> RangeReport:
    """The worst layer's peak against ``FP16_MAX / headroom``."""
    peaks = activation_peaks(model, faces, mels)
    layer, peak = max(peaks.items(), key=lambda kv: kv[1])
    return RangeReport(peak, layer, FP16_MAX / headroom)


def probe_mels(count: int = 8, seed: int = 0) -> torch.Tensor:
    """Mel windows spanning the normalised range the featurizer produces ([-4, 4]): silence (-4), the
    loudest (4) and uniform noise between."""
    gen = torch.Generator().manual_seed(seed)
    mels = torch.rand(count, 1, 80, 16, generator=gen) * 8.0 - 4.0
    mels[0] = -4.0
    if count > 1:
        mels[1] = 4.0
    return mels


def faces_subset(faces: torch.Tensor, limit: int) -> torch.Tensor:
    """At most ``limit`` frames, spread evenly over the avatar."""
    if faces.shape[0] <= limit:
        return faces
    index = torch.linspace(0, faces.shape[0] - 1, limit).round().long()
    return faces[index]


def check_avatar_fp16(model: Wav2Lip, name: str, inputs: npt.NDArray[np.float32]) -> RangeReport:
    """The check on an avatar's face inputs (T, 6, 96, 96), logged: info when fp16 is safe, else a warning
    that the backend renders in fp32 from now on."""
    faces = faces_subset(torch.from_numpy(inputs), RANGE_CHECK_FRAMES)
    report = check_fp16_range(model, faces, probe_mels())
    if report.fits_fp16:
        logger.info(
            "wav2lip avatar %r: largest activation %.1f (%s) fits fp16 (limit %.0f)",
            name,
            report.peak,
            report.layer,
            report.limit,
        )
    else:
        logger.warning(
            "wav2lip avatar %r: activation %.3g in %s is over the fp16 limit %.0f: falling back to fp32",
            name,
            report.peak,
            report.layer,
            report.limit,
        )
    return report
