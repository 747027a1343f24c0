"""The sharpen stage of the render engine: a restorer on the mouth region, blended into the paste.

After the lip-sync network, a backend holds each item's generated face region (``(N, 3, R, 96)``, BGR in
[0, 1]: face rows ``96 - R..95``, the rows its paste reads) and its pasted canvas (the ``off`` picture). For
the rows of the batch whose session asked for sharpen (strength > 0) this stage

1. gathers their face regions into a fixed batch of ``K`` rows (``K`` the smallest of the engine's batch
   sizes that holds them; the padding repeats the last row), flips them to RGB and runs the restorer there
   (x ``scale``; fp16 and channels_last on CUDA, one CUDA graph per ``K`` captured after cuDNN autotuning);
2. samples the restored region straight to the paste size with the same grid as the paste of the network's
   own output (the grid is in normalised coordinates, so it addresses the ``scale`` x larger region too):
   ``base`` is the network's output sampled that way, ``restored`` the restorer's, and the picture is
   ``base + w (restored - base)`` with ``w = strength * mouth mask``;
3. blends that into the avatar's pixels with the paste's own weight and writes the result where ``w > 0``
   only, so every pixel outside the mouth mask (and every row at strength 0) stays byte for byte the
   ``off`` canvas.

The mouth mask is a feathered box in 96 x 96 face space (from :data:`MOUTH_TOP_FRACTION` of the face down,
``feather_px`` of ramp at each edge), resampled with the paste's grid: it depends only on the avatar frame's
fixed box, never on the picture.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lipcast.pipeline.compositing import blend, feathered_box_profiles
from lipcast.pipeline.enhance.weights import Restorer

logger = logging.getLogger(__name__)

FACE_SIZE_PX = 96  # the lip-sync face crop the paste table addresses (Wav2Lip's)
MOUTH_TOP_FRACTION = 0.55  # the mouth mask starts a little below the paste's own (0.5)
MOUTH_FEATHER_PX = 6.0  # in 96 px face pixels
CAPTURE_WARMUP_ITERS = 3


def _resample_profile(profile: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """``profile`` (L,) at grid coordinates ``coords`` (N, M): bilinear, border, align_corners=False."""
    n, m = coords.shape
    image = profile.view(1, 1, 1, -1).expand(n, 1, 1, -1)
    grid = torch.stack((coords, torch.zeros_like(coords)), dim=-1)[:, None]
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=False).view(n, m)


def _axes_grid(gy: torch.Tensor, gx: torch.Tensor) -> torch.Tensor:
    n, height, width = gy.shape[0], gy.shape[1], gx.shape[1]
    return torch.stack((gx[:, None, :].expand(n, height, width), gy[:, :, None].expand(n, height, width)), -1)


def _sample(image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=False)


def sharpen_paste(
    face_rgb: torch.Tensor,
    restored_rgb: torch.Tensor,
    base_rgb: torch.Tensor,
    table: torch.Tensor,
    weight_profiles: tuple[torch.Tensor, torch.Tensor],
    strength: torch.Tensor,
    off_canvas: torch.Tensor,
) -> torch.Tensor:
    """The sharpened canvases ``(K, Hc, Wc, 3)`` uint8 (pure tensor code; CPU and CUDA alike).

    ``face_rgb``: (K, 3, R, 96) the network's region in [0, 1]; ``restored_rgb``: (K, 3, sR, 96 s) the
    restorer's; ``base_rgb``: (K, 3, Hc, Wc) uint8 avatar pixels; ``table``: the paste table rows
    (row coordinates, column coordinates, row weight, column weight); ``weight_profiles``: the mouth mask's
    row (R,) and column (96,) profiles over the region; ``strength``: (K,); ``off_canvas``: (K, Hc, Wc, 3)
    uint8, the paste without this stage (kept wherever the mouth weight is 0).
    """
    canvas_h, canvas_w = base_rgb.shape[2], base_rgb.shape[3]
    gy, gx, wy, wx = torch.split(table, [canvas_h, canvas_w, canvas_h, canvas_w], dim=1)
    grid = _axes_grid(gy, gx)
    off = _sample(face_rgb.float(), grid)
    restored = _sample(restored_rgb.float().clamp(0.0, 1.0), grid)
    rows_profile, cols_profile = weight_profiles
    mouth = _resample_profile(rows_profile, gy)[:, :, None] * _resample_profile(cols_profile, gx)[:, None, :]
    weight = (mouth * strength.view(-1, 1, 1).float())[:, None]  # (K, 1, Hc, Wc)
    mixed = torch.lerp(off, restored, weight)  # exactly ``off`` where the weight is 0
    alpha = (wy[:, :, None] * wx[:, None, :])[:, None]
    out = blend(base_rgb.float(), mixed * 255.0, alpha).round_().to(torch.uint8)
    out = out.permute(0, 2, 3, 1)
    return torch.where((weight > 0).permute(0, 2, 3, 1), out, off_canvas)


@dataclass
class _Graph:
    face: torch.Tensor  # static input (K, 3, R, 96), RGB, the restorer's dtype and memory format
    restored: torch.Tensor  # static output
    graph: torch.cuda.CUDAGraph


class MouthSharpener:
    """The restorer on one device at fixed batch sizes, and the blend of its output into the paste."""

    def __init__(
        self,
        restorer: Restorer,
        *,
        device: torch.device,
        region_rows: int,
        batch_sizes: Sequence[int],
        stream: torch.cuda.Stream | None = None,
        dtype: torch.dtype | None = None,
        cuda_graphs: bool = True,
        feather_px: float = MOUTH_FEATHER_PX,
        top_fraction: float = MOUTH_TOP_FRACTION,
    ) -> None:
        """``region_rows``: R, the face rows the backend produces (its bottom ones); ``batch_sizes``: the
        engine's buckets (the sharpen rows of a batch are padded to one of them). ``stream``: the backend's
        render stream on CUDA (the stage runs on it, after the lip-sync work)."""
        self.restorer = restorer
        self.device = device
        self._cuda = device.type == "cuda"
        half = self._cuda and restorer.supports_half
        self.dtype = dtype or (torch.float16 if half else torch.float32)
        self.memory_format = torch.channels_last if self._cuda else torch.contiguous_format
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.region_rows = region_rows
        self.scale = restorer.scale
        self._stream = stream
        self._use_graphs = self._cuda and cuda_graphs
        if self._cuda:
            torch.backends.cudnn.benchmark = True
        model = copy.deepcopy(restorer.model)  # one copy per device (``to`` moves a module in place)
        self.model = model.to(device, self.dtype, memory_format=self.memory_format)  # type: ignore[call-overload]
        self.model.eval().requires_grad_(False)
        rows, cols = feathered_box_profiles(
            FACE_SIZE_PX, FACE_SIZE_PX, feather_px, top_fraction=top_fraction, device=device
        )
        first_row = FACE_SIZE_PX - region_rows
        if bool((rows[:first_row] > 0).any()):
            raise ValueError(f"the mouth mask starts above the face rows the backend produces ({first_row})")
        self.profiles = (rows[first_row:].contiguous(), cols.contiguous())
        self._graphs: dict[int, _Graph] = {}
        self.calls: deque[int] = deque(maxlen=256)  # the batch sizes of the latest restorer runs

    def bucket(self, count: int) -> int:
        for size in self.batch_sizes:
            if size >= count:
                return size
        return self.batch_sizes[-1]

    # -- the restorer at fixed shapes ------------------------------------------------------------------

    def _input_shape(self, size: int) -> tuple[int, int, int, int]:
        return (size, 3, self.region_rows, FACE_SIZE_PX)

    def restore(self, face_rgb: torch.Tensor) -> torch.Tensor:
        """(K, 3, R, 96) in [0, 1] -> the restorer's (K, 3, sR, 96 s); K must be one of the batch sizes."""
        size = int(face_rgb.shape[0])
        self.calls.append(size)
        if self._use_graphs and size in self.batch_sizes:
            captured = self._graphs.get(size) or self._capture(size)
            captured.face.copy_(face_rgb)
            captured.graph.replay()
            return captured.restored
        x = face_rgb.to(self.dtype).contiguous(memory_format=self.memory_format)
        return self.model(x)

    def _capture(self, size: int) -> _Graph:
        stream = self._stream
        if stream is None:
            raise RuntimeError("CUDA graphs need the backend's CUDA stream")
        face = torch.zeros(self._input_shape(size), dtype=self.dtype, device=self.device)
        face = face.contiguous(memory_format=self.memory_format)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(CAPTURE_WARMUP_ITERS):  # cuDNN autotuning before the capture
                self.model(face)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            restored = self.model(face)
        captured = _Graph(face, restored, graph)
        self._graphs[size] = captured
        logger.info("sharpen: captured the restorer's CUDA graph of batch %d", size)
        return captured

    def prepare(self) -> None:
        """Autotune and capture every batch size now (before the server says ready)."""
        if not self._use_graphs:
            return
        with torch.no_grad():
            for size in self.batch_sizes:
                if size not in self._graphs:
                    self._capture(size)

    # -- the batch hook ----------------------------------------------------------------------------------

    def apply(
        self,
        canvases: torch.Tensor,
        face_bgr: torch.Tensor,
        frame_rows: torch.Tensor,
        base_table: torch.Tensor,
        paste_table: torch.Tensor,
        strengths: Sequence[float],
    ) -> None:
        """Sharpen, in place, the rows of ``canvases`` (N, Hc, Wc, 3) uint8 whose strength is > 0.

        ``face_bgr`` (N, 3, R, 96): the network's output; ``frame_rows`` (N,) int64: each item's row in the
        backend's per-avatar-frame tables ``base_table`` (F, 3, Hc, Wc) uint8 and ``paste_table`` (F, ...),
        the paste's inputs."""
        picked = [i for i, s in enumerate(strengths) if s > 0.0]
        if not picked:
            return
        size = self.bucket(len(picked))
        picked = picked[:size]
        padded = picked + [picked[-1]] * (size - len(picked))
        dev = canvases.device
        index = torch.tensor(padded, dtype=torch.int64).to(dev, non_blocking=True)
        strength = torch.tensor([strengths[i] for i in padded], dtype=torch.float32).to(
            dev, non_blocking=True
        )
        face_rgb = face_bgr.index_select(0, index).flip(1)
        restored = self.restore(face_rgb)
        frames = frame_rows.index_select(0, index)
        sharpened = sharpen_paste(
            face_rgb,
            restored,
            base_table.index_select(0, frames),
            paste_table.index_select(0, frames),
            self.profiles,
            strength,
            canvases.index_select(0, index),
        )
        count = len(picked)
        canvases.index_copy_(0, index[:count], sharpened[:count])
