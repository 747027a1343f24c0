from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lipcast.pipeline.wav2lip.checkpoint import (
    CheckpointError,
    check_state_dict,
    expected_shapes,
    load_checkpoint,
    load_wav2lip,
)
from lipcast.pipeline.wav2lip.model import Wav2Lip


@pytest.fixture(scope="module")
def model() -> Wav2Lip:
    torch.manual_seed(11)
    model = Wav2Lip().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.8, 1.2)
    return model


def sample() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return torch.randn(1, 1, 80, 16, generator=gen), torch.rand(1, 6, 96, 96, generator=gen)


def meta_state_dict() -> dict[str, torch.Tensor]:
    """Right names and shapes without memory (the checks read shapes only)."""
    return {k: torch.empty(shape, device="meta") for k, shape in expected_shapes().items()}


@pytest.mark.parametrize(
    ("zipfile", "prefix"), [(True, ""), (False, "module."), (True, "module."), (False, "")]
)
def test_round_trip_gives_identical_outputs(
    model: Wav2Lip, tmp_path: Path, zipfile: bool, prefix: str
) -> None:
    state = {prefix + k: v for k, v in model.state_dict().items()}
    payload = {"state_dict": state, "optimizer": None, "global_step": 3, "global_epoch": 1}
    path = tmp_path / "wav2lip.pth"
    torch.save(payload, path, _use_new_zipfile_serialization=zipfile)

    loaded = load_checkpoint(path, map_location="cpu")
    assert len(loaded) == 352 and not any(k.startswith("module.") for k in loaded)
    restored = load_wav2lip(path)
    assert not restored.training
    audio, face = sample()
    with torch.no_grad():
        assert torch.equal(restored(audio, face), model(audio, face))


def test_bare_state_dict_and_in_memory_sources(model: Wav2Lip, tmp_path: Path) -> None:
    path = tmp_path / "bare.pth"
    torch.save(model.state_dict(), path)
    audio, face = sample()
    with torch.no_grad():
        expected = model(audio, face)
        assert torch.equal(load_wav2lip(path)(audio, face), expected)
        assert torch.equal(load_wav2lip({"state_dict": model.state_dict()})(audio, face), expected)
        assert torch.equal(load_wav2lip(model.state_dict())(audio, face), expected)


def test_mismatched_state_dict_names_the_keys() -> None:
    state = meta_state_dict()
    del state["output_block.1.bias"]
    state["decoder.extra.weight"] = torch.empty(3, device="meta")
    state["audio_encoder.0.conv_block.0.weight"] = torch.empty(32, 1, 5, 5, device="meta")
    with pytest.raises(CheckpointError) as info:
        check_state_dict(state, "bad.pth")
    message = str(info.value)
    assert "bad.pth" in message
    assert "missing 1 keys: output_block.1.bias" in message
    assert "unexpected 1 keys: decoder.extra.weight" in message
    assert "audio_encoder.0.conv_block.0.weight (32, 1, 5, 5) != (32, 1, 3, 3)" in message


def test_long_key_lists_are_truncated_with_a_count() -> None:
    state = {k: v for k, v in meta_state_dict().items() if not k.startswith("face_decoder")}
    with pytest.raises(CheckpointError, match=r"missing 126 keys: .*\.\.\. and 118 more"):
        check_state_dict(state)


def test_syncnet_like_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "lipsync_expert.pth"
    state = {"face_encoder.0.conv_block.0.weight": torch.zeros(32, 15, 7, 7)}
    torch.save({"state_dict": state, "optimizer": None, "global_step": 1}, path)
    with pytest.raises(CheckpointError, match="missing 352 keys") as info:
        load_checkpoint(path)
    assert "unexpected 1 keys: face_encoder.0.conv_block.0.weight" in str(info.value)


def test_checkpoint_without_state_dict(tmp_path: Path) -> None:
    path = tmp_path / "partial.pth"
    torch.save({"global_step": 1, "weights": torch.zeros(1)}, path)
    with pytest.raises(CheckpointError, match="no 'state_dict' entry"):
        load_checkpoint(path)


class _Payload:
    pass


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "absent.pth")
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(junk)
    pickled = tmp_path / "code.pth"
    torch.save({"state_dict": {}, "hook": _Payload()}, pickled)
    with pytest.raises(CheckpointError, match="cannot read"):  # weights_only refuses arbitrary objects
        load_checkpoint(pickled)
