"""The per-avatar MuseTalk cache, written by ``lipcast avatar prepare --backend musetalk`` (or
:func:`write_cache`) into the avatar's directory and read when the avatar is added to the backend::

    NAME/musetalk/cache.json    {"version", "frames", "vae", "latent", "mask"}
    NAME/musetalk/boxes.npy     (T, 4) int32 face boxes
    NAME/musetalk/latents.npy   (T, 8, 32, 32) float16 [masked, reference] latent pairs
    NAME/musetalk/masks.npz     mask_000000 ... uint8 blend masks over each frame's patch

``vae`` identifies the VAE weights the latents were made with (:meth:`WeightFiles.fingerprint`); a cache of
other weights, another latent mode or another frame count is ignored (and the backend encodes the frames
itself, logging why).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.musetalk.faces import crop_faces, face_boxes, jaw_masks, latent_pairs

logger = logging.getLogger(__name__)

CACHE_DIR = "musetalk"
CACHE_VERSION = 1
MASK_KIND = "jaw-geometric"


@dataclass
class AvatarAssets:
    boxes: npt.NDArray[np.int32]
    latents: torch.Tensor  # (T, 8, 32, 32) float32
    masks: list[npt.NDArray[np.uint8]]


def compute_assets(avatar: Avatar, vae: Any, mode: str, device: torch.device | str = "cpu") -> AvatarAssets:
    boxes = face_boxes(avatar)
    latents = latent_pairs(vae, crop_faces(avatar.frames, boxes), mode, device)
    return AvatarAssets(boxes, latents, jaw_masks(avatar, boxes))


def prepare_cache(
    avatar: Avatar, weights: Path, mode: str = "mean", device: torch.device | str = "cpu"
) -> Path:
    """``lipcast avatar prepare --backend musetalk``: encode the avatar with the VAE of ``weights`` and write
    its cache (the server then adds the avatar without encoding it)."""
    from lipcast.pipeline.musetalk.weights import find_weights, load_vae

    if avatar.root is None:
        raise ValueError(f"avatar {avatar.name!r} has no directory to cache into")
    files = find_weights(weights)
    vae = load_vae(files).to(device)
    assets = compute_assets(avatar, vae, mode, device)
    return write_cache(avatar.root, assets, files.fingerprint(), mode)


def write_cache(root: Path, assets: AvatarAssets, vae_fingerprint: str, mode: str) -> Path:
    """Write the cache under ``root/musetalk`` (replacing one there), atomically."""
    work = root / f".{CACHE_DIR}.{secrets.token_hex(4)}"
    work.mkdir(parents=True)
    try:
        np.save(work / "boxes.npy", assets.boxes.astype(np.int32))
        np.save(work / "latents.npy", assets.latents.numpy().astype(np.float16))
        masks: dict[str, Any] = {f"mask_{i:06d}": m for i, m in enumerate(assets.masks)}
        np.savez_compressed(work / "masks.npz", **masks)
        meta = {
            "version": CACHE_VERSION,
            "frames": len(assets.boxes),
            "vae": vae_fingerprint,
            "latent": mode,
            "mask": MASK_KIND,
        }
        (work / "cache.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        target = root / CACHE_DIR
        if target.exists():
            shutil.rmtree(target)
        os.rename(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def read_cache(avatar: Avatar, vae_fingerprint: str, mode: str) -> AvatarAssets | None:
    """The avatar's cache if it matches (frames, VAE weights, latent mode), else None (logged)."""
    if avatar.root is None:
        return None
    folder = avatar.root / CACHE_DIR
    if not (folder / "cache.json").is_file():
        return None
    try:
        meta = json.loads((folder / "cache.json").read_text(encoding="utf-8"))
        expected = {
            "version": CACHE_VERSION,
            "frames": avatar.frame_count,
            "vae": vae_fingerprint,
            "latent": mode,
        }
        stale = {k: meta.get(k) for k, v in expected.items() if meta.get(k) != v}
        if stale:
            logger.info("avatar %r: musetalk cache not used (%s differ)", avatar.name, ", ".join(stale))
            return None
        boxes = np.load(folder / "boxes.npy")
        latents = torch.from_numpy(np.load(folder / "latents.npy").astype(np.float32))
        with np.load(folder / "masks.npz") as masks_file:
            masks = [masks_file[f"mask_{i:06d}"] for i in range(avatar.frame_count)]
    except (OSError, ValueError, KeyError) as e:
        logger.warning("avatar %r: musetalk cache unreadable (%s): encoding again", avatar.name, e)
        return None
    if boxes.shape != (avatar.frame_count, 4) or tuple(latents.shape[1:]) != (8, 32, 32):
        logger.warning("avatar %r: musetalk cache has the wrong shapes: encoding again", avatar.name)
        return None
    return AvatarAssets(boxes.astype(np.int32), latents, masks)
