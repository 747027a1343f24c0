"""MuseTalk's weights directory: the published layout, clear errors, the libraries' classes
(spec 1, 8.7-8.8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lipcast.pipeline.musetalk.config import UNET_CONFIG, full_configs
from lipcast.pipeline.musetalk.weights import (
    UNET_JSON,
    UNET_WEIGHTS,
    MuseTalkWeightsError,
    find_weights,
    load_models,
)
from tests.pipeline.musetalk_fixtures import tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("musetalk"))


def test_full_size_unet_has_the_published_parameter_and_key_counts() -> None:
    import diffusers

    with torch.device("meta"):
        unet = diffusers.UNet2DConditionModel.from_config(full_configs().unet)
        vae = diffusers.AutoencoderKL.from_config(full_configs().vae)
    assert len(unet.state_dict()) == 686
    assert sum(p.numel() for p in unet.parameters()) == 849_947_844
    decoder = sum(p.numel() for p in vae.decoder.parameters()) + sum(
        p.numel() for p in vae.post_quant_conv.parameters()
    )
    assert decoder == 49_490_199
    assert unet.conv_in.in_channels == 8 and unet.conv_out.out_channels == 4


def test_the_published_layout_loads_strictly_with_legacy_vae_names(checkpoint: Path) -> None:
    state = torch.load(checkpoint / "sd-vae" / "diffusion_pytorch_model.bin", weights_only=True)
    assert any(".attentions.0.query." in k for k in state)  # the old names, as sd-vae-ft-mse has them
    models = load_models(checkpoint)
    renamed = models.vae.state_dict()
    for key, value in state.items():
        new = key.replace(".query.", ".to_q.").replace(".key.", ".to_k.").replace(".value.", ".to_v.")
        new = new.replace(".proj_attn.", ".to_out.0.")
        assert torch.equal(renamed[new], value), key
    assert type(models.whisper).__name__ == "WhisperEncoder"
    assert type(models.unet).__name__ == "UNet2DConditionModel"


def test_every_missing_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "musetalkV15").mkdir()
    (tmp_path / UNET_JSON).write_text("{}")
    with pytest.raises(MuseTalkWeightsError) as e:
        find_weights(tmp_path)
    message = str(e.value)
    for name in (
        "unet.pth",
        "sd-vae/config.json",
        "diffusion_pytorch_model",
        "whisper/config.json",
        "pytorch_model.bin",
        "preprocessor_config.json",
    ):
        assert name in message, name
    assert "musetalk.json" not in message
    with pytest.raises(MuseTalkWeightsError, match="does not exist"):
        find_weights(tmp_path / "nowhere")


def test_a_config_value_that_is_not_musetalks_is_rejected(checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    copy = Path(shutil.copytree(checkpoint, tmp_path / "copy"))
    config = json.loads((copy / UNET_JSON).read_text())
    config.pop("_lipcast_small")  # claims to be the published configuration: every value is checked
    (copy / UNET_JSON).write_text(json.dumps(config))
    with pytest.raises(MuseTalkWeightsError, match="block_out_channels"):
        load_models(copy)
    config.update({k: v for k, v in UNET_CONFIG.items()})
    config["in_channels"] = 4
    (copy / UNET_JSON).write_text(json.dumps(config))
    with pytest.raises(MuseTalkWeightsError, match="in_channels=4"):
        load_models(copy)


def test_a_unet_file_of_another_model_names_its_keys(checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    copy = Path(shutil.copytree(checkpoint, tmp_path / "copy"))
    state = torch.load(copy / UNET_WEIGHTS, weights_only=True)
    state["extra.weight"] = torch.zeros(1)
    del state["conv_in.weight"]
    state["conv_out.bias"] = torch.zeros(7)
    torch.save({"state_dict": state}, copy / UNET_WEIGHTS)
    with pytest.raises(MuseTalkWeightsError, match="not a plain state dict"):
        load_models(copy)
    torch.save(state, copy / UNET_WEIGHTS)
    with pytest.raises(MuseTalkWeightsError) as e:
        load_models(copy)
    text = str(e.value)
    assert "missing 1 keys: conv_in.weight" in text and "unexpected 1 keys: extra.weight" in text
    assert "conv_out.bias (7,) != (4,)" in text
    (copy / UNET_WEIGHTS).write_bytes(b"not a checkpoint")
    with pytest.raises(MuseTalkWeightsError, match="cannot read"):
        load_models(copy)
