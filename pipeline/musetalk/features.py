"""Audio features: whisper's 5 hidden states, the per-frame window, MuseTalk's positional encoding, and the
offline features of a whole recording exactly as the reference builds them (spec 2.3-2.6).

Window of video frame ``f`` (25 fps): feature frames ``2f - 4 .. 2f + 5`` of the piece (50 per second), all 5
hidden states, zero where an index is negative or at/after the piece's real frames ``A``; flattened
time-major to 50 rows (row ``5 t + l``). The positional encoding is added to those 50 rows before the UNet.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from lipcast.pipeline.musetalk.config import HIDDEN_STATES
from lipcast.pipeline.musetalk.mel import PIECE_SAMPLES, SAMPLE_RATE_HZ, reference_log_mel

FloatArray = npt.NDArray[np.float32]

FEATURES_PER_SECOND = 50
WINDOW_SLOTS = 10  # 2 * (2 + 2 + 1)
WINDOW_BEFORE = 4  # slots before frame f's first feature (ceil(50 / 25) * 2)
PIECE_FEATURES = 1500
CONTEXT_TOKENS = WINDOW_SLOTS * HIDDEN_STATES  # 50


def positional_encoding(dim: int, tokens: int = CONTEXT_TOKENS) -> torch.Tensor:
    """(tokens, dim) float32: PE[p, 2i] = sin(p * div_i), PE[p, 2i + 1] = cos(p * div_i),
    div_i = exp(2i * -ln(10000) / dim)."""
    position = torch.arange(tokens, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(tokens, dim, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)
    return pe


def encoder_states(encoder: Any, log_mel: torch.Tensor) -> torch.Tensor:
    """(B, 80, 3000) log-mel -> (B, 1500, 5, D): the embedding output, layers 1-3, post-LN layer 4."""
    out = encoder(log_mel, output_hidden_states=True)
    states = out.hidden_states
    if len(states) != HIDDEN_STATES:
        raise RuntimeError(f"whisper returned {len(states)} hidden states, expected {HIDDEN_STATES}")
    return torch.stack(tuple(states), dim=2)


def window_indices(start: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per item: the window's feature indices (clamped into the piece) and which of them are real.

    ``start`` (B,) the first index (``2f - 4``), ``real`` (B,) the piece's real feature frames ``A``."""
    index = start[:, None] + torch.arange(WINDOW_SLOTS, device=start.device)[None, :]
    valid = (index >= 0) & (index < real[:, None]) & (index < PIECE_FEATURES)
    return index.clamp(0, PIECE_FEATURES - 1), valid


def gather_windows(states: torch.Tensor, start: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, 1500, 5, D) states -> (B, 50, D) windows, zero outside the real frames (before the PE)."""
    index, valid = window_indices(start, real)
    batch, _, layers, dim = states.shape
    picked = torch.gather(states, 1, index[:, :, None, None].expand(batch, WINDOW_SLOTS, layers, dim))
    picked = picked * valid[:, :, None, None].to(picked.dtype)
    return picked.reshape(batch, WINDOW_SLOTS * layers, dim)


def frame_counts(samples: int, fps: int = 25) -> tuple[int, int]:
    """(video frames n, real feature frames A) of a recording, by the reference's float expressions."""
    seconds = samples / SAMPLE_RATE_HZ
    return math.floor(seconds * fps), math.floor(seconds * FEATURES_PER_SECOND)


def window_start(frame: int, fps: int = 25) -> int:
    """First feature index of frame ``frame``'s window (``floor(f * 50 / fps) - 4``)."""
    return frame * FEATURES_PER_SECOND // fps - WINDOW_BEFORE


def offline_windows(encoder: Any, samples: FloatArray, device: torch.device | str = "cpu") -> torch.Tensor:
    """Every frame's (10, 5, D) window of a whole recording, as the reference computes it: 30 s pieces from
    sample 0, each its own log-mel and encoder pass, concatenated, trimmed to ``A``, zero-padded 4 in front
    and 12 behind (at most ``A`` each: the reference's slices), windows ``P[2f : 2f + 10]``. float32 on
    ``device``; (n, 10, 5, D)."""
    n, real = frame_counts(len(samples))
    if real < WINDOW_BEFORE:
        raise ValueError(f"{len(samples)} samples: the reference needs at least 80 ms of audio")
    pieces = []
    dtype = next(encoder.parameters()).dtype
    with torch.no_grad():
        for start in range(0, len(samples), PIECE_SAMPLES):
            mel = torch.from_numpy(reference_log_mel(samples[start : start + PIECE_SAMPLES]))
            pieces.append(encoder_states(encoder, mel[None].to(device, dtype))[0].float())
    features = torch.cat(pieces)[:real]
    front = features.new_zeros(min(WINDOW_BEFORE, real), *features.shape[1:])
    back = features.new_zeros(min(12, real), *features.shape[1:])
    padded = torch.cat((front, features, back))
    starts = [window_start(f) + WINDOW_BEFORE for f in range(n)]
    return torch.stack([padded[s : s + WINDOW_SLOTS] for s in starts])
