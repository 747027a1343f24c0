"""The weights directory (one path setting, ``--musetalk-weights DIR``) and loading it into the libraries'
classes: diffusers' ``UNet2DConditionModel`` and ``AutoencoderKL``, transformers' whisper encoder.

Layout (as MuseTalk publishes it under ``models/``; spec 1.1)::

    DIR/musetalkV15/unet.pth             plain diffusers UNet state dict (686 tensors), torch.save
    DIR/musetalkV15/musetalk.json        its constructor arguments
    DIR/sd-vae/config.json               stabilityai/sd-vae-ft-mse
    DIR/sd-vae/diffusion_pytorch_model.bin | .safetensors
    DIR/whisper/config.json              openai/whisper-tiny, the full checkpoint (only the encoder is used)
    DIR/whisper/pytorch_model.bin | model.safetensors
    DIR/whisper/preprocessor_config.json

Everything is read from disk (``local_files_only``); nothing is downloaded. A missing file, a config value
that is not MuseTalk 1.5's, or a state dict whose keys or shapes differ fails with
:class:`MuseTalkWeightsError` naming the file. The face parser and DWPose are not needed (spec 1.1: the
preparation here uses lipcast's own face tracking and a geometric mask).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lipcast.pipeline.musetalk.config import (
    UNET_CHECKED,
    UNET_CONFIG,
    VAE_CHECKED,
    VAE_CONFIG,
    WHISPER_CHECKED,
    WHISPER_CONFIG,
    WHISPER_PREPROCESSOR,
    ConfigMismatchError,
    ModelConfigs,
    check_config,
)
from lipcast.pipeline.wav2lip.checkpoint import state_dict_problems

UNET_WEIGHTS = "musetalkV15/unet.pth"
UNET_JSON = "musetalkV15/musetalk.json"
VAE_DIR = "sd-vae"
VAE_WEIGHTS = ("sd-vae/diffusion_pytorch_model.safetensors", "sd-vae/diffusion_pytorch_model.bin")
WHISPER_DIR = "whisper"
WHISPER_WEIGHTS = ("whisper/model.safetensors", "whisper/pytorch_model.bin")
WHISPER_PREPROCESSOR_JSON = "whisper/preprocessor_config.json"
REQUIRED_FILES = (
    UNET_WEIGHTS,
    UNET_JSON,
    "sd-vae/config.json",
    "whisper/config.json",
    WHISPER_PREPROCESSOR_JSON,
)
# In musetalk.json: the networks are a small configuration of the same classes (tests, dry runs); only the
# keys that fix the model's interfaces are checked then.
SMALL_MARKER = "_lipcast_small"
INTERFACE_KEYS = ("in_channels", "out_channels", "down_block_types", "up_block_types")

logger = logging.getLogger(__name__)


class MuseTalkWeightsError(ValueError):
    """The weights directory lacks a file, or a file is not what MuseTalk 1.5 publishes."""


def missing_extra_message() -> str:
    return "the musetalk backend needs the lipcast[musetalk] extra: pip install 'lipcast[musetalk]'"


def import_libraries() -> tuple[Any, Any]:
    """diffusers and transformers, or a clear error naming the extra."""
    try:
        import diffusers
        import transformers
    except ImportError as e:  # pragma: no cover - the extra is installed in CI
        raise MuseTalkWeightsError(f"{missing_extra_message()} ({e})") from e
    return diffusers, transformers


@dataclass(frozen=True)
class WeightFiles:
    root: Path
    unet: Path
    unet_json: Path
    vae_dir: Path
    vae_weights: Path
    whisper_dir: Path
    whisper_weights: Path

    def fingerprint(self) -> str:
        """Identifies the VAE weights (a prepared avatar's latents are only valid for the same file)."""
        stat = self.vae_weights.stat()
        return f"{self.vae_weights.name}:{stat.st_size}"


def find_weights(root: Path) -> WeightFiles:
    """Check the layout; :class:`MuseTalkWeightsError` lists every missing file (with its expected path)."""
    if not root.is_dir():
        raise MuseTalkWeightsError(f"MuseTalk weights directory {root} does not exist")
    missing = [str(root / rel) for rel in REQUIRED_FILES if not (root / rel).is_file()]
    vae = next((root / rel for rel in VAE_WEIGHTS if (root / rel).is_file()), None)
    whisper = next((root / rel for rel in WHISPER_WEIGHTS if (root / rel).is_file()), None)
    if vae is None:
        missing.append(" or ".join(str(root / rel) for rel in VAE_WEIGHTS))
    if whisper is None:
        missing.append(" or ".join(str(root / rel) for rel in WHISPER_WEIGHTS))
    if missing or vae is None or whisper is None:
        raise MuseTalkWeightsError(
            "MuseTalk weights incomplete; missing: " + "; ".join(missing) + " (see docs/musetalk.md)"
        )
    return WeightFiles(
        root, root / UNET_WEIGHTS, root / UNET_JSON, root / VAE_DIR, vae, root / WHISPER_DIR, whisper
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise MuseTalkWeightsError(f"{path}: not a readable JSON file: {e}") from e
    if not isinstance(data, dict):
        raise MuseTalkWeightsError(f"{path}: expected a JSON object")
    return data


def read_configs(files: WeightFiles, *, check: bool = True) -> ModelConfigs:
    """The three configs from the user's files; with ``check``, every value MuseTalk 1.5 fixes is checked."""
    unet = _read_json(files.unet_json)
    vae = _read_json(files.vae_dir / "config.json")
    whisper = _read_json(files.whisper_dir / "config.json")
    preprocessor = _read_json(files.root / WHISPER_PREPROCESSOR_JSON)
    small = bool(unet.get(SMALL_MARKER))
    if small:
        logger.warning(
            "%s: a small test configuration (%s), not MuseTalk 1.5's", files.unet_json, SMALL_MARKER
        )
    if check:
        try:
            unet_keys = INTERFACE_KEYS if small else UNET_CHECKED
            check_config(unet, UNET_CONFIG, unet_keys, str(files.unet_json))
            vae_keys = ("in_channels", "out_channels", "latent_channels") if small else VAE_CHECKED
            check_config(vae, VAE_CONFIG, vae_keys, str(files.vae_dir / "config.json"))
            whisper_keys = ("encoder_layers", "num_mel_bins") if small else WHISPER_CHECKED
            check_config(whisper, WHISPER_CONFIG, whisper_keys, str(files.whisper_dir / "config.json"))
            check_config(
                preprocessor,
                WHISPER_PREPROCESSOR,
                tuple(WHISPER_PREPROCESSOR),
                str(files.root / WHISPER_PREPROCESSOR_JSON),
            )
        except ConfigMismatchError as e:
            raise MuseTalkWeightsError(str(e)) from e
    if int(unet.get("cross_attention_dim", -1)) != int(whisper.get("d_model", -2)):
        raise MuseTalkWeightsError(
            f"{files.unet_json}: cross_attention_dim {unet.get('cross_attention_dim')} does not match "
            f"whisper's d_model {whisper.get('d_model')}"
        )
    return ModelConfigs(unet, vae, whisper)


def load_state_into(model: torch.nn.Module, state: Any, source: Path) -> None:
    """A strict load that names missing, unexpected and mis-shaped keys instead of torch's wall of text."""
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise MuseTalkWeightsError(
            f"{source}: not a plain state dict of tensors (a diffusers UNet's is expected)"
        )
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    problems = state_dict_problems(expected, state)
    if problems:
        raise MuseTalkWeightsError(f"{source} does not fit the configured UNet: {'; '.join(problems)}")
    model.load_state_dict(state, strict=True)


@dataclass
class MuseTalkModels:
    """The three networks, on the CPU in float32 as loaded (the backend moves and casts them)."""

    unet: Any  # diffusers.UNet2DConditionModel
    vae: Any  # diffusers.AutoencoderKL
    whisper: Any  # transformers WhisperEncoder
    configs: ModelConfigs

    def eval(self) -> MuseTalkModels:
        for model in (self.unet, self.vae, self.whisper):
            model.eval().requires_grad_(False)
        return self


def load_models(root: Path, *, check_configs: bool = True) -> MuseTalkModels:
    """Load every network from ``root`` (see the module docstring)."""
    diffusers, transformers = import_libraries()
    files = find_weights(root)
    configs = read_configs(files, check=check_configs)
    unet_config = {k: v for k, v in configs.unet.items() if not k.startswith("_")}
    unet = diffusers.UNet2DConditionModel.from_config(unet_config)
    try:
        state = torch.load(files.unet, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle and zip errors have many types
        raise MuseTalkWeightsError(f"{files.unet}: cannot read ({type(e).__name__}: {e})") from e
    load_state_into(unet, state, files.unet)
    vae = load_vae(files)
    try:
        whisper = transformers.WhisperModel.from_pretrained(str(files.whisper_dir), local_files_only=True)
    except Exception as e:
        raise MuseTalkWeightsError(
            f"{files.whisper_dir}: cannot load whisper ({type(e).__name__}: {e})"
        ) from e
    encoder = whisper.get_encoder()
    return MuseTalkModels(unet, vae, encoder, configs).eval()


def load_vae(files: WeightFiles) -> Any:
    """The VAE alone (avatar preparation needs only its encoder), in eval mode."""
    diffusers, _ = import_libraries()
    try:
        vae = diffusers.AutoencoderKL.from_pretrained(str(files.vae_dir), local_files_only=True)
    except Exception as e:
        raise MuseTalkWeightsError(f"{files.vae_dir}: cannot load the VAE ({type(e).__name__}: {e})") from e
    return vae.eval().requires_grad_(False)


def random_models(configs: ModelConfigs, seed: int = 0) -> MuseTalkModels:
    """The same classes with random weights (benchmarks and tests; nothing read or downloaded)."""
    diffusers, transformers = import_libraries()
    torch.manual_seed(seed)
    unet = diffusers.UNet2DConditionModel.from_config(configs.unet)
    vae = diffusers.AutoencoderKL.from_config(configs.vae)
    whisper_config = transformers.WhisperConfig(**configs.whisper)
    encoder = transformers.WhisperModel(whisper_config).get_encoder()
    return MuseTalkModels(unet, vae, encoder, configs).eval()


def write_checkpoint(models: MuseTalkModels, root: Path, *, legacy_vae_keys: bool = False) -> Path:
    """Write ``models`` in the published layout under ``root`` (tests and benchmarks: random weights).

    A configuration smaller than the published one is marked as such (:data:`SMALL_MARKER`).
    ``legacy_vae_keys``: the VAE's mid-block attention under its old names (query, key, value,
    proj_attn), as the original sd-vae-ft-mse file has them."""
    _, transformers = import_libraries()
    (root / "musetalkV15").mkdir(parents=True, exist_ok=True)
    torch.save(models.unet.state_dict(), root / UNET_WEIGHTS)
    unet_json: dict[str, Any] = {"_class_name": "UNet2DConditionModel", **models.configs.unet}
    if models.configs.unet != UNET_CONFIG:
        unet_json[SMALL_MARKER] = True
    (root / UNET_JSON).write_text(json.dumps(unet_json))
    vae_dir = root / VAE_DIR
    vae_dir.mkdir(parents=True, exist_ok=True)
    vae_config = {"_class_name": "AutoencoderKL", **models.configs.vae}
    (vae_dir / "config.json").write_text(json.dumps(vae_config))
    state = models.vae.state_dict()
    if legacy_vae_keys:
        state = {_legacy_vae_key(k): v for k, v in state.items()}
    torch.save(state, root / VAE_WEIGHTS[1])
    whisper_dir = root / WHISPER_DIR
    whisper_dir.mkdir(parents=True, exist_ok=True)
    config = transformers.WhisperConfig(**models.configs.whisper)
    config.to_json_file(str(whisper_dir / "config.json"))
    full = transformers.WhisperModel(config)
    full.encoder.load_state_dict(models.whisper.state_dict())
    torch.save({f"model.{k}": v for k, v in full.state_dict().items()}, root / WHISPER_WEIGHTS[1])
    (root / WHISPER_PREPROCESSOR_JSON).write_text(json.dumps({**WHISPER_PREPROCESSOR, "padding_value": 0.0}))
    return root


def _legacy_vae_key(key: str) -> str:
    for new, old in (("to_q", "query"), ("to_k", "key"), ("to_v", "value"), ("to_out.0", "proj_attn")):
        if f"attentions.0.{new}." in key:
            return key.replace(f"attentions.0.{new}.", f"attentions.0.{old}.")
    return key
