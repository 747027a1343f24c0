"""The published configurations of MuseTalk 1.5's three networks, and the check of a user's config files.

Values from the spec (sections 1.2, 1.4, 1.5). A user's ``musetalk.json``, ``sd-vae/config.json`` and
``whisper/config.json`` are read at start and every key listed here must hold this value: a different value
means different weights (or another model), which fail later in confusing ways. Keys not listed take the
libraries' defaults, which the spec relies on too. Tests build the same classes from :func:`tiny_configs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNET_CONFIG: dict[str, Any] = {
    "in_channels": 8,
    "out_channels": 4,
    "block_out_channels": [320, 640, 1280, 1280],
    "down_block_types": [
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "DownBlock2D",
    ],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "layers_per_block": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 384,
    "norm_num_groups": 32,
    "norm_eps": 1e-5,
    "act_fn": "silu",
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "downsample_padding": 1,
    "mid_block_scale_factor": 1,
    "center_input_sample": False,
    "sample_size": 64,
}
# Keys a user's file must match (sample_size is unused at run time; the latent is 32x32).
UNET_CHECKED = tuple(k for k in UNET_CONFIG if k != "sample_size")

VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "layers_per_block": 2,
    "latent_channels": 4,
    "norm_num_groups": 32,
    "act_fn": "silu",
    "sample_size": 256,
}
VAE_CHECKED = ("in_channels", "out_channels", "block_out_channels", "layers_per_block", "latent_channels")
SCALING_FACTOR = 0.18215  # sd-vae-ft-mse's config has none: the diffusers default

WHISPER_CONFIG: dict[str, Any] = {
    "d_model": 384,
    "encoder_layers": 4,
    "encoder_attention_heads": 6,
    "encoder_ffn_dim": 1536,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "activation_function": "gelu",
    "scale_embedding": False,
    # the decoder is never run; these only size the (unused) decoder half of a full checkpoint
    "decoder_layers": 4,
    "decoder_attention_heads": 6,
    "decoder_ffn_dim": 1536,
}
WHISPER_CHECKED = ("d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "num_mel_bins")
WHISPER_PREPROCESSOR: dict[str, Any] = {
    "feature_size": 80,
    "sampling_rate": 16000,
    "hop_length": 160,
    "n_fft": 400,
    "chunk_length": 30,
    "n_samples": 480000,
    "nb_max_frames": 3000,
}

LATENT_SIZE = 32
FACE_SIZE = 256  # the VAE's image side
CONTEXT_DIM = 384  # whisper-tiny's width: the UNet's cross-attention input
HIDDEN_STATES = 5  # embedding output, layers 1-3, post-LN layer 4


class ConfigMismatchError(ValueError):
    """A user's config file has a value this backend was not built for."""


def check_config(found: dict[str, Any], expected: dict[str, Any], keys: tuple[str, ...], source: str) -> None:
    """Raise :class:`ConfigMismatchError` naming every key of ``keys`` whose value differs (or is absent)."""
    problems = []
    for key in keys:
        want = expected[key]
        if key not in found:
            problems.append(f"{key} missing (expected {want!r})")
            continue
        got = found[key]
        if isinstance(want, list):
            got = list(got) if isinstance(got, list | tuple) else got
        if isinstance(want, float) and isinstance(got, int | float):
            if abs(got - want) > 1e-12:
                problems.append(f"{key}={got!r} (expected {want!r})")
        elif got != want:
            problems.append(f"{key}={got!r} (expected {want!r})")
    if problems:
        raise ConfigMismatchError(f"{source}: not MuseTalk 1.5's configuration: {'; '.join(problems)}")


@dataclass(frozen=True)
class ModelConfigs:
    """The three constructor configurations (full size, or tiny for tests)."""

    unet: dict[str, Any]
    vae: dict[str, Any]
    whisper: dict[str, Any]

    @property
    def context_dim(self) -> int:
        return int(self.whisper["d_model"])


def full_configs() -> ModelConfigs:
    return ModelConfigs(dict(UNET_CONFIG), dict(VAE_CONFIG), dict(WHISPER_CONFIG))


def tiny_configs() -> ModelConfigs:
    """The same classes and block types, narrow and shallow (tests on a CPU): same latent and face sizes, same
    window and positional encoding; only widths and depths differ. The whisper input stays 80x3000."""
    unet = dict(UNET_CONFIG)
    unet.update(
        block_out_channels=[32, 32, 64, 64],
        layers_per_block=1,
        attention_head_dim=2,
        cross_attention_dim=32,
        norm_num_groups=8,
    )
    vae = dict(VAE_CONFIG)
    vae.update(block_out_channels=[8, 16, 16, 16], layers_per_block=1, norm_num_groups=4)
    whisper = dict(WHISPER_CONFIG)
    whisper.update(
        d_model=32,
        encoder_layers=4,  # 5 hidden states, as the window needs
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
    )
    return ModelConfigs(unet, vae, whisper)
