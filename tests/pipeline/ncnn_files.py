"""Writes a compact net as an ncnn ``.param`` + ``.bin`` pair, laid out as Real-ESRGAN's own files are
(tests of the converter; the inverse of lipcast.pipeline.enhance.ncnn_convert)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch

TAG_FLOAT16 = 0x01306B47


def write_compact_ncnn(state: dict[str, torch.Tensor], scale: int, param: Path, weights: Path) -> None:
    conv_keys = sorted(
        (k for k in state if k.endswith(".weight") and state[k].ndim == 4), key=lambda k: int(k.split(".")[1])
    )
    lines = []
    blobs = 0

    def blob() -> str:
        nonlocal blobs
        blobs += 1
        return f"b{blobs}"

    lines.append("Input input 0 1 data")
    lines.append("Split split 1 2 data in_a in_b")
    current = "in_b"
    data = bytearray()
    for n, key in enumerate(conv_keys):
        w = state[key].float().numpy()
        b = state[key.replace("weight", "bias")].float().numpy()
        out = blob()
        lines.append(f"Convolution conv{n} 1 1 {current} {out} 0={w.shape[0]} 1=3 4=1 5=1 6={w.size}")
        data += (
            struct.pack("<I", TAG_FLOAT16) + w.astype(np.float16).tobytes() + b.astype(np.float32).tobytes()
        )
        current = out
        prelu_key = f"body.{int(key.split('.')[1]) + 1}.weight"
        if n < len(conv_keys) - 1:
            slopes = state[prelu_key].float().numpy()
            out = blob()
            lines.append(f"PReLU prelu{n} 1 1 {current} {out} 0={slopes.size}")
            data += slopes.astype(np.float32).tobytes()
            current = out
    shuffled = blob()
    lines.append(f"PixelShuffle shuffle 1 1 {current} {shuffled} 0={scale}")
    lines.append(f"Interp up 1 1 in_a skip 0=1 1={scale:e} 2={scale:e}")
    lines.append(f"BinaryOp add 2 1 {shuffled} skip output")
    header = f"7767517\n{len(lines)} {blobs + 5}\n"
    param.write_text(header + "\n".join(lines) + "\n")
    weights.write_bytes(bytes(data))
