"""The MuseTalk backend on a CPU with tiny random networks (spec 4 and 8.6-8.14): UNet at t = 0, the row
decode against a full decode, the masked input, the blend, the avatar cache, rendering mixed batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, load_avatar
from lipcast.pipeline.backend import RenderItem
from lipcast.pipeline.musetalk.backend import MuseTalkBackend
from lipcast.pipeline.musetalk.cache import compute_assets, read_cache, write_cache
from lipcast.pipeline.musetalk.decode import decode_full, decode_rows, plan_rows
from lipcast.pipeline.musetalk.faces import blur_kernel, center_rows, crop_side, face_boxes, vae_inputs
from lipcast.pipeline.warmup import speech_like_audio
from tests.pipeline.musetalk_fixtures import fresh_tiny_models, tiny_models


@pytest.fixture(scope="module")
def avatar():  # type: ignore[no-untyped-def]
    return load_avatar(BUILTIN_AVATAR_DIR / "astronaut")


@pytest.fixture(scope="module")
def backend(avatar) -> MuseTalkBackend:  # type: ignore[no-untyped-def]
    b = MuseTalkBackend(models=fresh_tiny_models(), batch_sizes=(1, 2, 4))
    b.add_avatar(avatar)
    return b


def test_time_embedding_at_t0_is_ones_then_zeros() -> None:
    unet = tiny_models().unet
    projected = unet.time_proj(torch.zeros(1, dtype=torch.long))
    half = projected.shape[1] // 2
    assert torch.equal(projected[0, :half], torch.ones(half)) and torch.equal(
        projected[0, half:], torch.zeros(half)
    )


def test_unet_maps_the_latent_pair_to_one_latent_independently_of_the_batch() -> None:
    unet = tiny_models().unet
    torch.manual_seed(1)
    latents, context = torch.randn(5, 8, 32, 32), torch.randn(5, 50, 32)
    with torch.no_grad():
        batched = unet(latents, torch.zeros(5, dtype=torch.long), encoder_hidden_states=context).sample
        single = unet(
            latents[3:4], torch.zeros(1, dtype=torch.long), encoder_hidden_states=context[3:4]
        ).sample
    assert batched.shape == (5, 4, 32, 32)
    assert torch.allclose(batched[3:4], single, rtol=1e-5, atol=1e-5)


def test_row_decode_is_exact_but_for_groupnorm() -> None:
    models = fresh_tiny_models()
    torch.manual_seed(2)
    z = torch.randn(2, 4, 32, 32)
    plan = plan_rows(models.vae.decoder, 120)
    with torch.no_grad():
        full, rows = decode_full(models.vae, z), decode_rows(models.vae, z, plan)
        assert rows.shape == (2, 3, 136, 256) and full.shape == (2, 3, 256, 256)
        groupnorm_gap = float((full[:, :, 120:] - rows).abs().max())
        # the receptive field: with every up-block GroupNorm a per-pixel affine map, the rows are exact
        for module in models.vae.decoder.up_blocks.modules():
            if isinstance(module, torch.nn.GroupNorm):
                module.forward = lambda x, m=module: (
                    x * m.weight[None, :, None, None] + m.bias[None, :, None, None]
                )  # type: ignore[method-assign]
        models.vae.decoder.conv_norm_out.forward = lambda x: x  # type: ignore[method-assign]
        full, rows = decode_full(models.vae, z), decode_rows(models.vae, z, plan)
        assert torch.allclose(full[:, :, 120:], rows, rtol=1e-5, atol=1e-5)
    assert groupnorm_gap > 0  # fewer rows in each GroupNorm's statistics: not exact (docs state the size)
    assert plan_rows(models.vae.decoder, 0).full


def test_masked_input_rows_and_the_latent_pair_order(avatar) -> None:  # type: ignore[no-untyped-def]
    crops = np.random.default_rng(0).integers(0, 256, (2, 256, 256, 3), dtype=np.uint8)
    masked, reference = vae_inputs(crops)
    assert torch.all(masked[:, :, 128:] == -1)
    expected = torch.from_numpy(crops).permute(0, 3, 1, 2).float() * 2 / 255 - 1
    assert torch.allclose(masked[:, :, :128], expected[:, :, :128], atol=1e-6)
    assert torch.allclose(reference, expected, atol=1e-6)
    models = tiny_models()
    assets = compute_assets(avatar, models.vae, "mean")
    with torch.no_grad():
        from lipcast.pipeline.musetalk.faces import crop_faces, encode

        m, r = vae_inputs(crop_faces(avatar.frames, assets.boxes))
        assert torch.allclose(assets.latents[:, :4], encode(models.vae, m, "mean"), atol=1e-5)
        assert torch.allclose(assets.latents[:, 4:], encode(models.vae, r, "mean"), atol=1e-5)


def test_face_box_is_symmetric_about_the_nose_ridge_with_the_margin(avatar) -> None:  # type: ignore[no-untyped-def]
    boxes = face_boxes(avatar)
    x1, y1, x2, y2 = boxes[0]
    chin = avatar.mouths[0, 5]
    assert (x1, x2) == tuple(avatar.face_boxes[0, [0, 2]])
    assert y2 == min(avatar.height, int(np.ceil(chin)) + 10)
    assert center_rows(boxes)[0] == (y1 + y2) // 2
    assert blur_kernel(300) == 31 and blur_kernel(344) == 35
    assert crop_side(np.array([0, 0, 201, 230])) == 2 * 172  # the spec's crop box: w 201, h 230 -> s 172


def test_blend_formula_matches_pil_and_the_mask_extremes() -> None:
    from PIL import Image

    rng = np.random.default_rng(3)
    orig = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    new = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, (16, 16), dtype=np.uint8)
    image = Image.fromarray(orig.copy())
    image.paste(Image.fromarray(new), (0, 0), Image.fromarray(alpha))
    v = orig.astype(np.int32) * (255 - alpha[..., None]) + new.astype(np.int32) * alpha[..., None]
    ours = (v + 128 + ((v + 128) >> 8)) >> 8
    assert np.array_equal(ours.astype(np.uint8), np.asarray(image))


def test_render_changes_only_the_lower_face_and_mixes_sessions(backend: MuseTalkBackend, avatar) -> None:  # type: ignore[no-untyped-def]
    featurizer = backend.new_featurizer()
    audio = speech_like_audio(1.5)
    conds = [featurizer.push(audio[i * 640 : (i + 1) * 640]) for i in range(len(audio) // 640)]
    silent = backend.new_featurizer().silence()
    patches = backend.render([RenderItem(avatar.name, 0, conds[-1]), RenderItem(avatar.name, 0, silent)])
    x1, y1, x2, y2 = face_boxes(avatar)[0]
    yc = int(center_rows(face_boxes(avatar))[0])
    for patch in patches:
        assert patch.top == yc and patch.left == x1 and patch.pixels.shape == (y2 - yc, x2 - x1, 3)
        # the jaw mask is zero at the patch's edges: the frame there is unchanged
        original = avatar.frames[0, yc:y2, x1:x2]
        assert np.array_equal(patch.pixels[0], original[0]) and np.array_equal(
            patch.pixels[:, 0], original[:, 0]
        )
    assert not np.array_equal(patches[0].pixels, patches[1].pixels)  # speech and silence differ
    again = backend.render([RenderItem(avatar.name, 0, conds[-1])])[0]
    # batch 1 against batch 2: the same frame to within one level (kernels differ by batch size)
    assert np.abs(again.pixels.astype(int) - patches[0].pixels.astype(int)).max() <= 1
    with pytest.raises(ValueError, match="conditioning"):
        backend.render([RenderItem(avatar.name, 0, np.zeros((80, 16), np.float32))])


def test_the_avatar_cache_round_trips_and_is_ignored_for_other_weights(avatar, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from lipcast.pipeline.avatar import write_avatar

    write_avatar(avatar, tmp_path / "astro")
    copy = load_avatar(tmp_path / "astro")
    assets = compute_assets(copy, tiny_models().vae, "mean")
    write_cache(copy.root, assets, "vae-a", "mean")  # type: ignore[arg-type]
    cached = read_cache(copy, "vae-a", "mean")
    assert cached is not None
    assert np.array_equal(cached.boxes, assets.boxes)
    assert torch.allclose(cached.latents, assets.latents.half().float())
    assert all(np.array_equal(a, b) for a, b in zip(cached.masks, assets.masks, strict=True))
    assert read_cache(copy, "vae-b", "mean") is None and read_cache(copy, "vae-a", "sample") is None


def test_gpu_free_defaults(backend: MuseTalkBackend) -> None:
    assert backend.lookahead_ms == 80.0 and backend.conditioning_shape == (81, 3000)
    assert backend.dtype == torch.float32 and backend.check_fp16() == {}
    timings = backend.warmup()
    assert sorted(timings) == [1, 2, 4]
