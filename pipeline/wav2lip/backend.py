"""The Wav2Lip :class:`~lipcast.pipeline.backend.LipSyncBackend`.

Per avatar, once (``add_avatar``): face inputs (:mod:`.faces`) go through the BN-folded face encoder and
the seven skip features of every frame stay on the device, with the frame's original face-box pixels.
Per batch (``render``): the mel windows are uploaded, the cached features of each item's (avatar, frame)
are gathered from one global table (so a batch may mix avatars), the audio encoder and the decoder run,
and the 96x96 faces are pasted back into their boxes on the device (:mod:`.paste`, a feathered lower-face
blend). Only the rows of a box that the blend can change (from :func:`.paste.first_blended_row`, about the
lower half) are produced and travel back, RGB uint8; the patch's ``top`` is that row.

Fixed shapes: every such region of every avatar fits a shared canvas (the largest, rounded up to 8 px); an
item fills its canvas's top-left corner and the rest is cut off on the host, where the patches are views of
the batch's download (a fresh block of torch's caching pinned allocator; no host copy).

On CUDA: fp16 (default), channels_last, conv units as single cuDNN calls (:mod:`.fused`; eager only), cuDNN
autotuning (``torch.backends.cudnn.benchmark``, process-wide), a dedicated stream, pinned host buffers and
one CUDA graph per batch size in ``batch_sizes``. A graph covers everything on the device (the gather of
the items' cached features and face pixels from the global tables, audio encoder, decoder and paste) and
the upload of the batch's mel windows and rows from a static pinned buffer, so a render is one replay and
one download (into fresh pinned memory: the patches are views of it). Adding or removing an avatar
recaptures the graphs (they hold the tables' addresses) at once. On the CPU: fp32, the same code without
graphs.
With ``compile_cache`` given (CUDA), the audio encoder + decoder of every bucket run as ``torch.compile``
kernels (:mod:`.compiled`) inside those graphs, built at a bucket's first render (or loaded from the
cache); a compile that fails leaves the backend on its eager kernels, with a warning. Sizes that are not
buckets always run eager (a new shape would mean a new compile).
The decoder runs only on the face rows the paste reads (:mod:`.rows`: rows 47..95 of 96 for the default
mask, about two thirds of its work), so the cached features are cropped to the rows it reads: 163,328
values per avatar frame (0.33 MB in fp16; all of them: 290,816).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from lipcast.pipeline.avatar import Avatar
from lipcast.pipeline.backend import RenderedPatch, RenderItem
from lipcast.pipeline.defaults import COMPILE_MODE, WAV2LIP, default_batch_sizes
from lipcast.pipeline.enhance.stage import FACE_SIZE_PX, MouthSharpener
from lipcast.pipeline.enhance.weights import Restorer
from lipcast.pipeline.timing import FPS
from lipcast.pipeline.warmup import time_batch_sizes
from lipcast.pipeline.wav2lip.checkpoint import load_wav2lip
from lipcast.pipeline.wav2lip.compile_cache import CompileCache, environment_key
from lipcast.pipeline.wav2lip.compiled import CompiledDecoder, Compiler
from lipcast.pipeline.wav2lip.faces import DEFAULT_FACE_PADS, prepare_face_inputs
from lipcast.pipeline.wav2lip.featurizer import CONDITIONING_SHAPE, INFERENCE_ALIGNMENT, Wav2LipFeaturizer
from lipcast.pipeline.wav2lip.fold import fold_batchnorm
from lipcast.pipeline.wav2lip.fused import fuse_conv_units
from lipcast.pipeline.wav2lip.gather import gather_rows, rows_without
from lipcast.pipeline.wav2lip.mel import SAMPLE_RATE_HZ
from lipcast.pipeline.wav2lip.model import N_FACE_FEATURES
from lipcast.pipeline.wav2lip.paste import (
    DEFAULT_FEATHER_PX,
    DEFAULT_MASK_TOP_FRACTION,
    face_mask,
    face_mask_profiles,
    paste_faces,
    paste_table,
)
from lipcast.pipeline.wav2lip.range_check import RangeReport, check_avatar_fp16
from lipcast.pipeline.wav2lip.rows import crop_features, decode_rows, first_face_row, plan_rows
from lipcast.pipeline.wav2lip.tables import AvatarEntry, batch_rows, face_canvas, remove_entry

logger = logging.getLogger(__name__)

FACE_ENCODE_BATCH = 32  # avatar frames per face-encoder call in add_avatar
CAPTURE_WARMUP_ITERS = 3  # eager runs on the capture stream before a graph capture (cuDNN autotuning)
Checkpoint = str | PathLike[str] | Mapping[str, torch.Tensor] | None


@dataclass
class _Bucket:
    """Static buffers and the CUDA graph of one batch size. The graph gathers the rows' cached features,
    face-box pixels and geometry from the avatar tables itself, so one replay does all the device work; it
    holds the tables' addresses, so every change to the tables recaptures it."""

    upload_host: torch.Tensor  # pinned float32: mel windows, then rows (int64); the graph copies it
    upload: torch.Tensor  # its device twin; ``mel`` and ``rows`` are views of it
    mel: torch.Tensor  # (N, 1, 80, 16) float32, device
    rows: torch.Tensor  # (N,) int64, device
    out: torch.Tensor  # (N, Hc, Wc, 3) uint8, device (the graph's output)
    face: torch.Tensor  # (N, 3, R, 96) the network's face rows, device (read by the sharpen stage)
    graph: torch.cuda.CUDAGraph


class Wav2LipBackend:
    """Wav2Lip rendering with cached face features and on-device compositing."""

    name = WAV2LIP
    crossfade_frames = 3  # its lower face never equals the avatar's own: blend idle <-> speaking switches

    def __init__(
        self,
        checkpoint: Checkpoint = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        batch_sizes: Sequence[int] | None = None,
        face_pads: Sequence[int] = DEFAULT_FACE_PADS,
        fps: int = FPS,
        window_offset_frames: int = INFERENCE_ALIGNMENT,
        feather_px: float = DEFAULT_FEATHER_PX,
        mask_top_fraction: float = DEFAULT_MASK_TOP_FRACTION,
        cuda_graphs: bool = True,
        check_fp16_range: bool = True,
        compile_cache: CompileCache | None = None,
        compile_mode: str = COMPILE_MODE,
        compiler: Compiler | None = None,
        fuse_units: bool | None = None,
        crop_rows: bool = True,
        restorer: Restorer | None = None,
    ) -> None:
        """``checkpoint``: a path, a (checkpoint or state) dict, or None for random weights (tests).

        ``dtype`` None means float16 on CUDA and float32 elsewhere. With ``check_fp16_range`` every avatar
        added while the dtype is float16 is first run through the model in fp32 with activation hooks
        (:mod:`.range_check`); if any layer comes near the float16 limit the backend switches to fp32.

        ``compile_cache``: compile the buckets' network kernels (:mod:`.compiled`), caching them there; None
        renders with eager kernels. ``compiler`` replaces ``torch.compile`` (tests). ``fuse_units``: conv
        units as single cuDNN calls on CUDA (:mod:`.fused`); None fuses them for eager kernels only.
        ``crop_rows``: decode only the face rows the paste reads (:mod:`.rows`); False decodes all 96.
        ``restorer``: the sharpen stage's network (:mod:`lipcast.pipeline.enhance`), run for the items whose
        ``enhance_strength`` is above 0; None: no item is sharpened.
        """
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self.dtype = dtype or (torch.float16 if self._cuda else torch.float32)
        self.batch_sizes = tuple(sorted(set(batch_sizes or default_batch_sizes(self.device))))
        self.face_pads = tuple(face_pads)
        self.fps = fps
        self.window_offset_frames = window_offset_frames
        self._lookahead_samples = Wav2LipFeaturizer(fps, window_offset_frames).lookahead_samples
        self.memory_format = torch.channels_last if self._cuda else torch.contiguous_format
        self._use_graphs = self._cuda and cuda_graphs
        self.check_fp16_range = check_fp16_range
        self.range_reports: dict[str, RangeReport] = {}  # per avatar, from its fp16 check
        if self._cuda:
            torch.backends.cudnn.benchmark = True
        self._stream = torch.cuda.Stream(device=self.device) if self._cuda else None
        model = fold_batchnorm(load_wav2lip(checkpoint, map_location="cpu"))
        # Eager CUDA only: compiled kernels fuse on their own (H200 b128: 29.4k f/s compiled, 29.0k fused)
        fuse = compile_cache is None if fuse_units is None else fuse_units
        model = fuse_conv_units(model) if self._cuda and fuse else model
        self.model = model.to(self.device, self.dtype, memory_format=self.memory_format)  # type: ignore[call-overload]
        self.model.requires_grad_(False)
        self.mask_top_fraction = mask_top_fraction
        self._mask_profiles = face_mask_profiles(feather_px, mask_top_fraction, device=self.device)
        self.row_plan = plan_rows(self.model, first_face_row(mask_top_fraction) if crop_rows else 0)
        mask = face_mask(feather_px, mask_top_fraction)
        if self.row_plan.first_row and bool(mask[:, :, : self.row_plan.first_row + 1].any()):
            raise ValueError(f"the blend mask reaches face row {self.row_plan.first_row}: decode more rows")
        self._avatars: dict[str, AvatarEntry] = {}
        self._feats: list[torch.Tensor] = []  # 7 x (F, C, H, W) over all avatar frames
        self._base = torch.empty(0, 3, 0, 0, dtype=torch.uint8, device=self.device)
        self._geometry = torch.empty(0, 3, dtype=torch.float32, device=self.device)  # box h, w, first row
        self._paste = torch.empty(0, 0, dtype=torch.float32, device=self.device)  # paste_table rows
        self._canvas_hw = (0, 0)
        self._buckets: dict[int, _Bucket] = {}
        self._compile_cache = compile_cache
        self.compile_mode = compile_mode
        self._compiler = compiler
        self.compiled: CompiledDecoder | None = None
        self._new_compiled()
        self.sharpener: MouthSharpener | None = None
        if restorer is not None:
            self.sharpener = MouthSharpener(
                restorer,
                device=self.device,
                region_rows=FACE_SIZE_PX - self.row_plan.first_row,
                batch_sizes=self.batch_sizes,
                stream=self._stream,
                cuda_graphs=cuda_graphs,
            )
            self.sharpener.prepare()
        # The engine calls everything from its worker thread; the lock keeps a stray add_avatar from
        # another thread from swapping the tables under a render.
        self._lock = threading.RLock()

    # -- seam properties -----------------------------------------------------------------------------------

    @property
    def sharpen_device(self) -> str | None:
        """Where the sharpen stage runs ("cuda", "cpu"), or None without a restorer."""
        return None if self.sharpener is None else self.device.type

    @property
    def conditioning_shape(self) -> tuple[int, ...]:
        return CONDITIONING_SHAPE

    @property
    def lookahead_ms(self) -> float:
        return self._lookahead_samples * 1000.0 / SAMPLE_RATE_HZ

    def new_featurizer(self) -> Wav2LipFeaturizer:
        return Wav2LipFeaturizer(self.fps, self.window_offset_frames)

    # -- avatars -------------------------------------------------------------------------------------------

    def add_avatar(self, avatar: Avatar) -> None:
        """Encode every frame's face once and keep the features and face-box pixels on the device."""
        with self._lock, torch.no_grad():
            self._add_avatar(avatar)
            self._recapture()

    def _add_avatar(self, avatar: Avatar) -> None:
        if avatar.name in self._avatars:
            self._remove_avatar(avatar.name)
        inputs, boxes = prepare_face_inputs(avatar, self.face_pads)
        if self.dtype == torch.float16 and self.check_fp16_range:
            report = check_avatar_fp16(self.model, avatar.name, inputs)
            self.range_reports[avatar.name] = report
            if not report.fits_fp16:
                self._use_fp32()
        canvas = face_canvas(avatar, boxes, self.mask_top_fraction, self._canvas_hw)
        canvas_hw = canvas.canvas_hw
        with self._on_stream():
            feats = self._encode_faces(inputs)
            base_t = torch.from_numpy(canvas.base).to(self.device).permute(0, 3, 1, 2).contiguous()
            geometry = torch.from_numpy(canvas.geometry)
            if canvas_hw != self._canvas_hw:
                pad = (0, canvas_hw[1] - self._base.shape[3], 0, canvas_hw[0] - self._base.shape[2])
                self._base = F.pad(self._base, pad)
                self._canvas_hw = canvas_hw  # the graphs (recaptured by the caller) get the new size
                logger.info("wav2lip canvas is now %dx%d px", canvas_hw[1], canvas_hw[0])
            offset = int(self._geometry.shape[0])
            self._feats = (
                feats
                if not self._feats
                else [torch.cat((old, new)) for old, new in zip(self._feats, feats, strict=True)]
            )
            self._base = torch.cat((self._base, base_t))
            self._geometry = torch.cat((self._geometry, geometry.to(self.device)))
            self._paste = self._paste_table()
        self._sync()
        self._avatars[avatar.name] = AvatarEntry(offset, avatar.frame_count, boxes, canvas.first_rows)
        logger.info("wav2lip avatar %r: %d frames encoded", avatar.name, avatar.frame_count)

    def _paste_table(self) -> torch.Tensor:
        """Every avatar frame's paste row (:func:`.paste.paste_table`) for the current canvas."""
        return paste_table(self._geometry, *self._canvas_hw, self._mask_profiles, self.row_plan.first_row)

    def _use_fp32(self) -> None:
        """Switch the model and the cached tables to float32 (graphs are recaptured by the caller)."""
        self.dtype = torch.float32
        with self._on_stream():
            self.model = self.model.float()
            self._feats = [t.float() for t in self._feats]
        self._sync()
        self._buckets.clear()
        self._new_compiled()

    def _new_compiled(self) -> None:
        """The compiled network of the current model and dtype (when compiling), built lazily per size."""
        if self._compile_cache is None:
            self.compiled = None
            return
        key = environment_key(self.device, self.dtype, self.compile_mode)
        self.compiled = CompiledDecoder(
            self.model, key, self._compile_cache, self.batch_sizes, self.row_plan, compiler=self._compiler
        )

    def _network(self, audio: torch.Tensor, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        """Audio encoder + decoder: the compiled kernels for a bucket's size, else eager."""
        if self.compiled is not None and audio.shape[0] in self.batch_sizes:
            try:
                return self.compiled(audio, feats)
            except Exception as e:  # a compiler failure must not take rendering down
                if self._cuda and torch.cuda.is_current_stream_capturing():
                    raise
                logger.warning(
                    "torch.compile failed (%s: %s): rendering with eager kernels", type(e).__name__, e
                )
                self.compiled = None
        return decode_rows(self.model, self.model.encode_audio(audio), feats, self.row_plan)

    def _encode_faces(self, inputs: npt.NDArray[np.float32]) -> list[torch.Tensor]:
        chunks: list[list[torch.Tensor]] = [[] for _ in range(N_FACE_FEATURES)]
        for start in range(0, inputs.shape[0], FACE_ENCODE_BATCH):
            x = torch.from_numpy(inputs[start : start + FACE_ENCODE_BATCH]).to(self.device)
            x = x.to(self.dtype).contiguous(memory_format=self.memory_format)
            for level, feat in enumerate(self.model.encode_face(x)):
                chunks[level].append(feat)
        feats = [torch.cat(c).contiguous(memory_format=self.memory_format) for c in chunks]
        return crop_features(feats, self.row_plan)

    def remove_avatar(self, name: str) -> None:
        with self._lock, torch.no_grad():
            self._remove_avatar(name)
            self._recapture()

    def _remove_avatar(self, name: str) -> None:
        entry = remove_entry(self._avatars, name)
        total = int(self._geometry.shape[0])
        keep = rows_without(entry.offset, entry.count, total, self.device)
        with self._on_stream():
            self._feats = [gather_rows(t, keep) for t in self._feats]
            self._base = self._base.index_select(0, keep)
            self._geometry = self._geometry.index_select(0, keep)
            self._paste = self._paste_table()
        self._sync()

    # -- rendering -----------------------------------------------------------------------------------------

    def _compute(
        self,
        mel: torch.Tensor,
        feats: Sequence[torch.Tensor],
        base: torch.Tensor,
        paste: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mel (N, 1, 80, 16) float32 + gathered tables -> (N, Hc, Wc, 3) uint8 RGB canvases, and the
        network's face rows they were pasted from."""
        audio = mel.to(self.dtype).contiguous(memory_format=self.memory_format)
        face = self._network(audio, feats)
        return paste_faces(face, base, paste), face

    def _sharpen_hook(
        self, canvases: torch.Tensor, face: torch.Tensor, rows: torch.Tensor, items: Sequence[RenderItem]
    ) -> None:
        """The face post-processing of the batch's sharpen rows, in place on the device canvases
        (:class:`lipcast.pipeline.enhance.stage.MouthSharpener`); nothing without a restorer or such rows."""
        if self.sharpener is not None:
            strengths = [item.enhance_strength for item in items]
            self.sharpener.apply(canvases, face, rows, self._base, self._paste, strengths)

    def render(self, items: Sequence[RenderItem]) -> list[RenderedPatch]:
        """Render a batch; one patch per item, in order: RGB uint8 rows ``row0..h`` of the padded face box.

        The patches are (non-contiguous) views of one array downloaded for this batch.
        """
        if not items:
            return []
        with self._lock, torch.no_grad():
            return self._render(items)

    def _render(self, items: Sequence[RenderItem]) -> list[RenderedPatch]:
        rows, entries = batch_rows(self._avatars, items)
        finish = None
        if self._use_graphs and len(items) in self.batch_sizes:
            canvases, finish = self._launch_graph(rows, items)
        else:
            mels = np.stack([item.conditioning for item in items]).astype(np.float32, copy=False)
            canvases = self._render_eager(rows, mels, items)
        patches = []  # views of the download (fresh per render), built while the device works on it
        try:
            for canvas, item, entry in zip(canvases, items, entries, strict=True):
                x1, y1, x2, y2 = (int(v) for v in entry.boxes[item.frame_index])
                row0 = int(entry.first_rows[item.frame_index])
                patches.append(RenderedPatch(canvas[: y2 - y1 - row0, : x2 - x1], top=y1 + row0, left=x1))
        finally:
            if finish is not None:
                finish()  # the download has landed
        return patches

    def _render_eager(
        self, rows: npt.NDArray[np.int64], mels: npt.NDArray[np.float32], items: Sequence[RenderItem]
    ) -> npt.NDArray[np.uint8]:
        with self._on_stream():
            index = torch.from_numpy(rows).to(self.device)
            mel = torch.from_numpy(mels).to(self.device)[:, None]
            feats = [gather_rows(t, index) for t in self._feats]
            out, face = self._compute(
                mel, feats, self._base.index_select(0, index), self._paste.index_select(0, index)
            )
            self._sharpen_hook(out, face, index, items)
            result = out.cpu().numpy()
        return result

    def _launch_graph(
        self, rows: npt.NDArray[np.int64], items: Sequence[RenderItem]
    ) -> tuple[npt.NDArray[np.uint8], Callable[[], None]]:
        """Queue a bucket's upload, replay and download: the (not yet filled) host canvases, and the wait."""
        stream = self._stream
        if stream is None:
            raise RuntimeError("CUDA graphs need a CUDA device")
        bucket = self._buckets.get(len(rows)) or self._capture(len(rows))
        host = bucket.upload_host.numpy()
        mel_values = bucket.mel.numel()
        mel_host = host[:mel_values].reshape(-1, *CONDITIONING_SHAPE)
        for index, item in enumerate(items):  # in place: np.stack took 214 us at batch 128 on the H200
            mel_host[index] = item.conditioning
        host[mel_values:].view(np.int64)[:] = rows
        with torch.cuda.stream(stream):
            bucket.graph.replay()  # the upload is the graph's first node
            self._sharpen_hook(bucket.out, bucket.face, bucket.rows, items)
            # torch's caching pinned allocator; back when the last patch view goes (copies: 2x slower)
            out_host = torch.empty(bucket.out.shape, dtype=torch.uint8, pin_memory=True)
            out_host.copy_(bucket.out, non_blocking=True)
        return out_host.numpy(), stream.synchronize  # the wait also guards the upload buffers

    def _gathered_compute(self, mel: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the rows from the avatar tables and render them (the body of a bucket's graph)."""
        feats = [gather_rows(t, rows) for t in self._feats]  # channels_last on CUDA, no extra copy
        return self._compute(mel, feats, self._base.index_select(0, rows), self._paste.index_select(0, rows))

    def _recapture(self) -> None:
        """The tables moved (an avatar came or went): recapture every graph now, off the hot path."""
        sizes = list(self._buckets)
        self._buckets.clear()
        if self._use_graphs and self._avatars:
            for size in sizes:
                self._capture(size)

    def _capture(self, size: int) -> _Bucket:
        """Allocate one batch size's static buffers and capture its CUDA graph."""
        if not self._avatars or self._stream is None:
            raise RuntimeError("add an avatar before rendering")
        dev = self.device
        mel_values = size * int(np.prod(CONDITIONING_SHAPE))
        upload = torch.zeros(mel_values + 2 * size, dtype=torch.float32, device=dev)  # int64 = 2 float32
        mel = upload[:mel_values].view(size, 1, *CONDITIONING_SHAPE)
        rows = upload[mel_values:].view(torch.int64)
        upload_host = torch.zeros(upload.shape, pin_memory=True)  # static: the graph copies from it
        self._stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(self._stream):
            for _ in range(CAPTURE_WARMUP_ITERS):
                self._gathered_compute(mel, rows)
        self._stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self._stream, capture_error_mode="thread_local"):
            upload.copy_(upload_host, non_blocking=True)  # one launch less per render
            out, face = self._gathered_compute(mel, rows)
        bucket = _Bucket(
            upload_host=upload_host,
            upload=upload,
            mel=mel,
            rows=rows,
            out=out,
            face=face,
            graph=graph,
        )
        self._buckets[size] = bucket
        logger.info("wav2lip: captured the CUDA graph of batch %d", size)
        return bucket

    def warmup(self) -> dict[int, float]:
        """Render every batch size once (autotuning, graph capture), then time it. Returns ms per size."""
        if not self._avatars:
            raise RuntimeError("add an avatar before warming up the wav2lip backend")
        name, entry = next(iter(self._avatars.items()))
        silence = np.full(CONDITIONING_SHAPE, -4.0, dtype=np.float32)
        timings = time_batch_sizes(self.render, name, entry.count, silence, self.batch_sizes, repeats=1)
        logger.info("wav2lip warm-up: %s", ", ".join(f"b{k}={v:.1f}ms" for k, v in timings.items()))
        return timings

    # -- streams -------------------------------------------------------------------------------------------

    def _on_stream(self) -> torch.cuda.StreamContext:
        """The dedicated stream on CUDA; a no-op context elsewhere."""
        return torch.cuda.stream(self._stream)

    def _sync(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
