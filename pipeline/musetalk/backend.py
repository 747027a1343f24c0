"""The MuseTalk :class:`~lipcast.pipeline.backend.LipSyncBackend`.

Per avatar, once (``add_avatar``): the face boxes, latent pairs and blend masks (from the avatar's cache,
:mod:`.cache`, or computed with the VAE encoder) go into global device tables with each frame's patch of
original pixels: the rows from the face box's centre to its bottom, the box's columns, on a canvas shared by
all avatars (the largest patch, rounded up to 8 px).

Per batch (``render``, any mix of avatars and sessions): the items' conditionings (:mod:`.featurizer`) are
uploaded, each becomes its 80x3000 log-mel (the silent columns filled in on the device), whisper's encoder
gives the 5 hidden states, the frame's window plus the positional encoding is the UNet's context, the UNet
runs once at timestep 0 on the item's cached 8-channel latent, the VAE decodes the rows the mask uses
(:mod:`.decode`), and the face is resized into its box and blended through the mask on the device
(the reference's integer blend, spec 4.4). Only the patch (RGB uint8) travels back.

On CUDA: fp16 (the reference's real-time precision), channels_last, cuDNN autotuning, a dedicated stream,
one CUDA graph per batch size (captured at warm-up, all graphs sharing one memory pool: they never run at
once), pinned upload buffers; and an fp16 check at warm-up (:meth:`check_fp16`): a batch is run with every
module's output watched; a non-finite value or one near the fp16 limit switches the backend to fp32.
On the CPU: fp32, the same code without graphs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.defaults import COMPILE_MODE, MUSETALK, default_batch_sizes
from lipcast.pipeline.musetalk.cache import AvatarAssets, compute_assets, read_cache
from lipcast.pipeline.musetalk.compiled import CompiledNetworks
from lipcast.pipeline.musetalk.config import FACE_SIZE
from lipcast.pipeline.musetalk.decode import DEFAULT_FIRST_FACE_ROW, decode_rows, plan_rows
from lipcast.pipeline.musetalk.faces import center_rows
from lipcast.pipeline.musetalk.features import encoder_states, gather_windows, positional_encoding
from lipcast.pipeline.musetalk.featurizer import (
    DEFAULT_CONTEXT_S,
    DEFAULT_FLOOR,
    DEFAULT_LOOKAHEAD_MS,
    META_PAD,
    META_REAL,
    META_ROW,
    META_START,
    MuseTalkFeaturizer,
    check_settings,
    conditioning_shape,
)
from lipcast.pipeline.musetalk.mel import N_MELS, PIECE_COLUMNS, SAMPLE_RATE_HZ
from lipcast.pipeline.musetalk.weights import MuseTalkModels, find_weights, load_models
from lipcast.pipeline.timing import FPS
from lipcast.pipeline.warmup import speech_like_audio, time_batch_sizes
from lipcast.pipeline.wav2lip.compile_cache import CompileCache, environment_key
from lipcast.pipeline.wav2lip.compiled import Compiler
from lipcast.pipeline.wav2lip.gather import gather_rows, rows_without
from lipcast.pipeline.wav2lip.tables import CANVAS_MULTIPLE_PX, AvatarEntry, batch_rows, remove_entry

logger = logging.getLogger(__name__)

DECODE_MODES = ("rows", "full")
CAPTURE_WARMUP_ITERS = 2
FP16_LIMIT = 0.5 * 65504.0  # an activation above this (in the fp16 check) switches to fp32


@dataclass
class _Bucket:
    upload_host: torch.Tensor  # pinned float32: conditionings, then rows (int64)
    upload: torch.Tensor
    cond: torch.Tensor  # (N, 81, C) float32, device
    rows: torch.Tensor  # (N,) int64, device
    out: torch.Tensor  # (N, Hc, Wc, 3) uint8
    graph: torch.cuda.CUDAGraph


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class MuseTalkBackend:
    """MuseTalk 1.5 rendering with cached latents and on-device compositing (see the module docstring)."""

    name = MUSETALK
    crossfade_frames = 3  # a rendered lower face never equals the avatar's own

    def __init__(
        self,
        weights: Path | None = None,
        *,
        models: MuseTalkModels | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        batch_sizes: Sequence[int] | None = None,
        context_s: float = DEFAULT_CONTEXT_S,
        rebase_s: float | None = None,
        lookahead_ms: float | None = None,
        floor: str = DEFAULT_FLOOR,
        decode: str = "rows",
        latent_mode: str = "mean",
        cuda_graphs: bool = True,
        check_fp16_range: bool = True,
        compile_cache: CompileCache | None = None,
        compile_mode: str = COMPILE_MODE,
        compiler: Compiler | None = None,
        channels_last: bool | None = None,
    ) -> None:
        """``weights``: the weights directory (:mod:`.weights`); or ``models`` (random weights: tests).

        ``compile_cache`` (:func:`.compiled.musetalk_cache`): the buckets' UNet and decode run as
        ``torch.compile`` kernels (:mod:`.compiled`) built or loaded at warm-up; None: eager kernels.
        ``compiler`` replaces ``torch.compile`` (tests). ``channels_last``: the convolutions' memory format
        (default: on CUDA)."""
        if decode not in DECODE_MODES:
            raise ValueError(f"musetalk decode {decode!r}: one of {', '.join(DECODE_MODES)}")
        self.lookahead = DEFAULT_LOOKAHEAD_MS if lookahead_ms is None else lookahead_ms
        check_settings(context_s, rebase_s, self.lookahead, floor)
        self.context_s, self.rebase_s, self.floor = context_s, rebase_s, floor
        self._shape = conditioning_shape(context_s)
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self.dtype = dtype or (torch.float16 if self._cuda else torch.float32)
        self.batch_sizes = tuple(sorted(set(batch_sizes or default_batch_sizes(self.device, MUSETALK))))
        use_cl = self._cuda if channels_last is None else channels_last
        self.memory_format = torch.channels_last if use_cl else torch.contiguous_format
        self._use_graphs = self._cuda and cuda_graphs
        self.check_fp16_range = check_fp16_range
        self.latent_mode = latent_mode
        if models is None:
            if weights is None:
                raise ValueError("the musetalk backend needs its weights directory (--musetalk-weights DIR)")
            self.vae_fingerprint = find_weights(weights).fingerprint()
            models = load_models(weights)
        else:
            self.vae_fingerprint = "random"
        self.models = models
        if self._cuda:
            torch.backends.cudnn.benchmark = True
        self._stream = torch.cuda.Stream(device=self.device) if self._cuda else None
        self._place_models()
        dim = models.configs.context_dim
        self._pe = positional_encoding(dim).to(self.device)
        self.row_plan = plan_rows(models.vae.decoder, DEFAULT_FIRST_FACE_ROW if decode == "rows" else 0)
        self._avatars: dict[str, AvatarEntry] = {}
        self._latents = torch.empty(0, 8, 32, 32, device=self.device, dtype=self.dtype)
        self._base = torch.empty(0, 3, 0, 0, dtype=torch.uint8, device=self.device)
        self._mask = torch.empty(0, 0, 0, dtype=torch.uint8, device=self.device)
        self._geometry = torch.empty(0, 3, dtype=torch.float32, device=self.device)  # box w, h, centre
        self._canvas_hw = (0, 0)
        self._buckets: dict[int, _Bucket] = {}
        self._pool: Any = None
        self.fp16_report: dict[str, float] = {}
        self._lock = threading.RLock()
        self._compile_cache, self.compile_mode, self._compiler = compile_cache, compile_mode, compiler
        self.compiled: CompiledNetworks | None = None
        self._new_compiled()

    def _new_compiled(self) -> None:
        """The compiled networks of the current models and dtype (when compiling), built lazily per size."""
        if self._compile_cache is None:
            self.compiled = None
            return
        key = environment_key(self.device, self.dtype, self.compile_mode)
        m = self.models
        self.compiled = CompiledNetworks(
            m.unet, m.vae, self.row_plan, key, self._compile_cache, self.batch_sizes, compiler=self._compiler
        )

    def _place_models(self) -> None:
        m = self.models
        m.unet.to(self.device, self.dtype, memory_format=self.memory_format)
        m.vae.to(self.device, self.dtype, memory_format=self.memory_format)
        m.whisper.to(self.device, self.dtype)
        self._timestep = torch.zeros(1, dtype=torch.long, device=self.device)

    # -- seam properties -----------------------------------------------------------------------------------

    @property
    def conditioning_shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def lookahead_ms(self) -> float:
        return self.lookahead

    def new_featurizer(self) -> MuseTalkFeaturizer:
        return MuseTalkFeaturizer(
            context_s=self.context_s, rebase_s=self.rebase_s, lookahead_ms=self.lookahead, floor=self.floor
        )

    # -- avatars -------------------------------------------------------------------------------------------

    def add_avatar(self, avatar: Avatar) -> None:
        with self._lock, torch.no_grad():
            self._add_avatar(avatar)
            self._recapture()

    def assets_for(self, avatar: Avatar) -> AvatarAssets:
        """The avatar's cache if valid for these weights, else computed now with the VAE encoder."""
        cached = read_cache(avatar, self.vae_fingerprint, self.latent_mode)
        if cached is not None:
            return cached
        logger.info("musetalk avatar %r: encoding %d frames", avatar.name, avatar.frame_count)
        with self._on_stream():
            assets = compute_assets(avatar, self.models.vae, self.latent_mode, self.device)
        self._sync()
        return assets

    def _add_avatar(self, avatar: Avatar) -> None:
        if avatar.name in self._avatars:
            self._remove_avatar(avatar.name)
        assets = self.assets_for(avatar)
        boxes = assets.boxes
        centers = center_rows(boxes)
        heights = boxes[:, 3] - centers
        widths = boxes[:, 2] - boxes[:, 0]
        canvas = (
            max(self._canvas_hw[0], _round_up(int(heights.max()), CANVAS_MULTIPLE_PX)),
            max(self._canvas_hw[1], _round_up(int(widths.max()), CANVAS_MULTIPLE_PX)),
        )
        base = np.zeros((avatar.frame_count, *canvas, 3), np.uint8)
        mask = np.zeros((avatar.frame_count, *canvas), np.uint8)
        for i, (x1, _, x2, y2) in enumerate(boxes):
            yc = int(centers[i])
            base[i, : y2 - yc, : x2 - x1] = avatar.frames[i, yc:y2, x1:x2]
            mask[i, : y2 - yc, : x2 - x1] = assets.masks[i]
        geometry = np.stack((widths, boxes[:, 3] - boxes[:, 1], centers - boxes[:, 1]), axis=1).astype(
            np.float32
        )
        with self._on_stream():
            if canvas != self._canvas_hw:
                pad = (0, canvas[1] - self._base.shape[3], 0, canvas[0] - self._base.shape[2])
                self._base = F.pad(self._base, pad)
                self._mask = F.pad(self._mask, pad[:4])
                self._canvas_hw = canvas
            offset = int(self._geometry.shape[0])
            latents = assets.latents.to(self.device, self.dtype).contiguous(memory_format=self.memory_format)
            self._latents = torch.cat((self._latents, latents)).contiguous(memory_format=self.memory_format)
            self._base = torch.cat((self._base, torch.from_numpy(base).to(self.device).permute(0, 3, 1, 2)))
            self._mask = torch.cat((self._mask, torch.from_numpy(mask).to(self.device)))
            self._geometry = torch.cat((self._geometry, torch.from_numpy(geometry).to(self.device)))
        self._sync()
        first_rows = (centers - boxes[:, 1]).astype(np.int32)
        self._avatars[avatar.name] = AvatarEntry(offset, avatar.frame_count, boxes, first_rows)
        logger.info(
            "musetalk avatar %r: %d frames, canvas %dx%d", avatar.name, avatar.frame_count, *canvas[::-1]
        )

    def remove_avatar(self, name: str) -> None:
        with self._lock, torch.no_grad():
            self._remove_avatar(name)
            self._recapture()

    def _remove_avatar(self, name: str) -> None:
        entry = remove_entry(self._avatars, name)
        total = int(self._geometry.shape[0])
        keep = rows_without(entry.offset, entry.count, total, self.device)
        with self._on_stream():
            self._latents = gather_rows(self._latents, keep)
            self._base = self._base.index_select(0, keep)
            self._mask = self._mask.index_select(0, keep)
            self._geometry = self._geometry.index_select(0, keep)
        self._sync()

    # -- the computation -----------------------------------------------------------------------------------

    def context(self, cond: torch.Tensor) -> torch.Tensor:
        """(B, 81, C) conditionings -> (B, 50, D) UNet contexts (windows + PE), in the model dtype."""
        batch = cond.shape[0]
        meta = cond[:, META_ROW]
        mel = meta[:, META_PAD, None, None].expand(batch, N_MELS, PIECE_COLUMNS).clone()
        width = min(cond.shape[2], PIECE_COLUMNS)
        mel[:, :, :width] = cond[:, :N_MELS, :width]
        states = encoder_states(self.models.whisper, mel.to(self.dtype))
        windows = gather_windows(states, meta[:, META_START].long(), meta[:, META_REAL].long())
        return windows + self._pe.to(windows.dtype)

    def faces(self, cond: torch.Tensor, rows: torch.Tensor, *, compiled: bool = True) -> torch.Tensor:
        """Conditionings and table rows -> (B, 3, 256 - first row, 256) decoded faces in [-1, 1].

        The UNet and the decode run as the compiled kernels for a bucket's size (when compiling and
        ``compiled``), else eager."""
        context = self.context(cond)
        latents = gather_rows(self._latents, rows).contiguous(memory_format=self.memory_format)
        timestep = self._timestep.expand(latents.shape[0])
        if compiled and self.compiled is not None and latents.shape[0] in self.batch_sizes:
            try:
                return self.compiled(latents, self._timestep, context)
            except Exception as e:  # a compiler failure must not take rendering down
                if self._cuda and torch.cuda.is_current_stream_capturing():
                    raise
                logger.warning(
                    "torch.compile failed (%s: %s): rendering with eager kernels", type(e).__name__, e
                )
                self.compiled = None
        predicted = self.models.unet(latents, timestep, encoder_hidden_states=context).sample
        return decode_rows(self.models.vae, predicted, self.row_plan)

    def _compute(self, cond: torch.Tensor, rows: torch.Tensor, *, compiled: bool = True) -> torch.Tensor:
        """-> (B, Hc, Wc, 3) uint8 RGB canvases: the face resized into its box and blended (spec 4.3-4.4)."""
        face = self.faces(cond, rows, compiled=compiled)
        face_u8 = torch.round((face.float() / 2 + 0.5).clamp(0, 1) * 255.0)
        geometry = self._geometry.index_select(0, rows)
        height, width = self._canvas_hw
        first = self.row_plan.out_row
        cols = torch.arange(width, device=face.device, dtype=torch.float32)
        lines = torch.arange(height, device=face.device, dtype=torch.float32)
        box_w, box_h, center = geometry[:, 0:1], geometry[:, 1:2], geometry[:, 2:3]
        gx = (cols[None] + 0.5) / box_w * 2 - 1  # (B, Wc), align_corners=False, as cv2's INTER_LINEAR
        v = (lines[None] + center + 0.5) * (FACE_SIZE / box_h) - 0.5 - first  # source row in the decode
        gy = (v + 0.5) / (FACE_SIZE - first) * 2 - 1
        grid = torch.stack(
            (gx[:, None, :].expand(-1, height, -1), gy[:, :, None].expand(-1, -1, width)), dim=-1
        )
        new = torch.round(
            F.grid_sample(face_u8, grid, mode="bilinear", padding_mode="border", align_corners=False)
        )
        alpha = self._mask.index_select(0, rows)[:, None].int()
        orig = self._base.index_select(0, rows).int()
        value = orig * (255 - alpha) + new.int() * alpha
        out = (value + 128 + ((value + 128) >> 8)) >> 8
        return out.to(torch.uint8).permute(0, 2, 3, 1).contiguous()

    # -- rendering -----------------------------------------------------------------------------------------

    def render(self, items: Sequence[RenderItem]) -> list[RenderedPatch]:
        if not items:
            return []
        with self._lock, torch.no_grad():
            rows, entries = batch_rows(self._avatars, items, self._shape)
            finish: Callable[[], None] | None = None
            if self._use_graphs and len(items) in self.batch_sizes:
                canvases, finish = self._launch_graph(rows, items)
            else:
                canvases = self._render_eager(rows, items)
            patches = []
            try:
                for canvas, item, entry in zip(canvases, items, entries, strict=True):
                    x1, y1, x2, y2 = (int(v) for v in entry.boxes[item.frame_index])
                    row0 = int(entry.first_rows[item.frame_index])
                    patches.append(RenderedPatch(canvas[: y2 - y1 - row0, : x2 - x1], top=y1 + row0, left=x1))
            finally:
                if finish is not None:
                    finish()
            return patches

    def _render_eager(
        self, rows: npt.NDArray[np.int64], items: Sequence[RenderItem]
    ) -> npt.NDArray[np.uint8]:
        cond = np.stack([item.conditioning for item in items]).astype(np.float32, copy=False)
        with self._on_stream():
            out = self._compute(
                torch.from_numpy(cond).to(self.device), torch.from_numpy(rows).to(self.device)
            )
            result = out.cpu().numpy()
        return result

    def _launch_graph(
        self, rows: npt.NDArray[np.int64], items: Sequence[RenderItem]
    ) -> tuple[npt.NDArray[np.uint8], Callable[[], None]]:
        stream = self._stream
        assert stream is not None
        bucket = self._buckets.get(len(rows)) or self._capture(len(rows))
        host = bucket.upload_host.numpy()
        values = bucket.cond.numel()
        cond_host = host[:values].reshape(-1, *self._shape)
        for index, item in enumerate(items):
            cond_host[index] = item.conditioning
        host[values:].view(np.int64)[:] = rows
        with torch.cuda.stream(stream):
            bucket.graph.replay()
            out_host = torch.empty(bucket.out.shape, dtype=torch.uint8, pin_memory=True)
            out_host.copy_(bucket.out, non_blocking=True)
        return out_host.numpy(), stream.synchronize

    def _recapture(self) -> None:
        sizes = list(self._buckets)
        self._buckets.clear()
        if self._use_graphs and self._avatars:
            for size in sorted(sizes, reverse=True):
                self._capture(size)

    def _capture(self, size: int) -> _Bucket:
        if not self._avatars or self._stream is None:
            raise RuntimeError("add an avatar before rendering")
        values = size * int(np.prod(self._shape))
        upload = torch.zeros(values + 2 * size, dtype=torch.float32, device=self.device)
        cond = upload[:values].view(size, *self._shape)
        rows = upload[values:].view(torch.int64)
        upload_host = torch.zeros(upload.shape, pin_memory=True)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for _ in range(CAPTURE_WARMUP_ITERS):
                self._compute(cond, rows)
        self._stream.synchronize()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"):
            upload.copy_(upload_host, non_blocking=True)
            out = self._compute(cond, rows)
        bucket = _Bucket(upload_host, upload, cond, rows, out, graph)
        self._buckets[size] = bucket
        logger.info("musetalk: captured the CUDA graph of batch %d", size)
        return bucket

    # -- warm-up -------------------------------------------------------------------------------------------

    def speech_conditioning(self, seconds: float = 2.0) -> npt.NDArray[np.float32]:
        """A conditioning of voiced test audio (warm-up and the fp16 check)."""
        featurizer = self.new_featurizer()
        audio = speech_like_audio(seconds)
        hop = SAMPLE_RATE_HZ // FPS
        cond = featurizer.silence()
        for start in range(0, len(audio) - hop + 1, hop):
            cond = featurizer.push(audio[start : start + hop])
        return cond

    def check_fp16(self) -> dict[str, float]:
        """Run one batch with every module's output watched; switch to fp32 if fp16 comes near its limit."""
        if self.dtype != torch.float16 or not self._avatars:
            return {}
        name, entry = next(iter(self._avatars.items()))
        cond = torch.from_numpy(self.speech_conditioning()).to(self.device)[None]
        rows = torch.tensor([entry.offset], device=self.device)
        peaks: dict[str, float] = {}

        def watch(label: str) -> Callable[..., None]:
            def hook(_module: Any, _inputs: Any, output: Any) -> None:
                tensor = output[0] if isinstance(output, tuple) else getattr(output, "sample", output)
                if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                    finite = bool(torch.isfinite(tensor).all())
                    peaks[label] = max(
                        peaks.get(label, 0.0), float(tensor.abs().max()) if finite else float("inf")
                    )

            return hook

        handles = []
        for model_name, model in (
            ("unet", self.models.unet),
            ("vae", self.models.vae),
            ("whisper", self.models.whisper),
        ):
            for module_name, module in model.named_modules():
                if module_name and not list(module.children()):
                    handles.append(module.register_forward_hook(watch(f"{model_name}.{module_name}")))
        try:
            with torch.no_grad(), self._on_stream():
                self._compute(cond, rows, compiled=False)  # the hooks watch eager modules
            self._sync()
        finally:
            for handle in handles:
                handle.remove()
        worst = max(peaks.items(), key=lambda kv: kv[1]) if peaks else ("", 0.0)
        self.fp16_report = {"max_abs": worst[1], "layers_watched": float(len(peaks))}
        if not np.isfinite(worst[1]) or worst[1] > FP16_LIMIT:
            logger.warning("musetalk: fp16 reaches %g in %s: rendering in fp32", worst[1], worst[0])
            self.dtype = torch.float32
            self._place_models()
            self._latents = self._latents.float()
            self._buckets.clear()
            self._pool = None
            self._new_compiled()
        else:
            logger.info("musetalk: fp16 check passed (largest activation %.1f in %s)", worst[1], worst[0])
        return self.fp16_report

    def warmup(self) -> dict[int, float]:
        """The fp16 check, then every batch size once (cuDNN autotuning, graph capture), timed."""
        if not self._avatars:
            raise RuntimeError("add an avatar before warming up the musetalk backend")
        self.check_fp16()
        name, entry = next(iter(self._avatars.items()))
        cond = self.speech_conditioning()
        timings = time_batch_sizes(
            self.render, name, entry.count, cond, sorted(self.batch_sizes, reverse=True), repeats=1
        )
        logger.info("musetalk warm-up: %s", ", ".join(f"b{k}={v:.1f}ms" for k, v in sorted(timings.items())))
        return dict(sorted(timings.items()))

    # -- streams -------------------------------------------------------------------------------------------

    def _on_stream(self) -> torch.cuda.StreamContext:
        return torch.cuda.stream(self._stream)  # a no-op context on the CPU

    def _sync(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
