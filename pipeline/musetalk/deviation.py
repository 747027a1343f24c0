"""Streaming against offline audio features (spec 7.4): ``lipcast musetalk deviation REC.wav ...``.

For each recording (16 kHz mono, or any rate PyAV can resample) the offline reference
(:func:`offline_windows`, fp32, and in fp16 for the precision floor) is compared with what
:class:`MuseTalkFeaturizer` hands the engine for every frame, fed in 20 ms pieces (the streaming layer's hops
are whole frames: two pieces a push) on the featurizer's own clock, each frame's window frozen when it is
emitted. Per hidden state l = 0..4: the relative L2 ``|F_str - F_off| / |F_off|`` per frame and the per-token
cosine, mean and p95, over speech, silence and the frames within 1 s of a 30 s piece boundary.

The sanity case (``--sanity``) is the reference's own piece layout with unlimited lookahead (context and
rebase 30 s, the ``input`` floor, each frame taken once its whole piece is in): it must match offline
exactly, which validates the harness; its maximum |difference| is printed.

Random weights (``--random full|tiny``) measure the features' path, not a trained model's sensitivity; the
embedding layer (l = 0) depends on the log-mel alone, so its deviation is what the floor policy and the
lookahead cost whatever the weights.
"""

from __future__ import annotations

import argparse
import itertools
import json
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from lipcast.pipeline.musetalk.config import HIDDEN_STATES, full_configs, tiny_configs
from lipcast.pipeline.musetalk.features import encoder_states, frame_counts, gather_windows, offline_windows
from lipcast.pipeline.musetalk.featurizer import META_PAD, META_REAL, META_ROW, META_START, MuseTalkFeaturizer
from lipcast.pipeline.musetalk.mel import SAMPLE_RATE_HZ

FloatArray = npt.NDArray[np.float32]
PIECE_MS = 20
ENCODE_BATCH = 16
SILENCE_DB = -35.0  # a frame whose RMS is this far below the recording's loudest frame is silence
BOUNDARY_S = 1.0


@dataclass(frozen=True)
class Candidate:
    lookahead_ms: float | None  # None: unlimited (the whole piece)
    context_s: float
    rebase_s: float | None
    floor: str

    @property
    def label(self) -> str:
        look = "inf" if self.lookahead_ms is None else f"{self.lookahead_ms:g}"
        rebase = "" if self.rebase_s is None else f"/{self.rebase_s:g}"
        return f"L={look}ms W={self.context_s:g}{rebase}s floor={self.floor}"


def read_recording(path: Path) -> FloatArray:
    """Mono float32 at 16 kHz: a 16 kHz 16-bit WAV directly, anything else through PyAV."""
    try:
        with wave.open(str(path)) as w:
            if w.getframerate() == SAMPLE_RATE_HZ and w.getsampwidth() == 2:
                data = np.frombuffer(w.readframes(w.getnframes()), np.int16).reshape(-1, w.getnchannels())
                return (data.mean(axis=1) / 32768.0).astype(np.float32)
    except (wave.Error, EOFError):
        pass
    from lipcast.pipeline.audio_file import decode_audio

    return decode_audio(path, SAMPLE_RATE_HZ)


def stream_conditionings(audio: FloatArray, candidate: Candidate) -> FloatArray:
    """Every frame's conditioning as the live featurizer emits it ((n, 81, C)), fed 20 ms at a time."""
    n, _ = frame_counts(len(audio))
    if candidate.lookahead_ms is None:
        return np.stack(_unlimited(audio, n, candidate))
    featurizer = MuseTalkFeaturizer(
        context_s=candidate.context_s,
        rebase_s=candidate.rebase_s,
        lookahead_ms=candidate.lookahead_ms,
        floor=candidate.floor,
    )
    hop = featurizer.samples_per_frame
    piece = SAMPLE_RATE_HZ * PIECE_MS // 1000
    # the recording, then silence until its last frame's lookahead is in
    padded = np.concatenate((audio, np.zeros(featurizer.lookahead_samples + hop, np.float32)))
    out: list[FloatArray] = []
    pending = np.zeros(0, np.float32)
    for start in range(0, len(padded) - piece + 1, piece):
        pending = np.concatenate((pending, padded[start : start + piece]))
        if len(pending) < hop:
            continue
        cond = featurizer.push(pending[:hop])
        pending = pending[hop:]
        if len(out) < n and featurizer.frames_pushed > featurizer.lag_frames:
            out.append(cond)
    return np.stack(out)


def _unlimited(audio: FloatArray, n: int, candidate: Candidate) -> list[FloatArray]:
    """Each frame with its whole piece available: a featurizer fed up to the piece's end (or the
    recording's), then asked for every frame of the piece."""
    featurizer = MuseTalkFeaturizer(
        context_s=candidate.context_s, rebase_s=candidate.rebase_s, lookahead_ms=0.0, floor=candidate.floor
    )
    hop = featurizer.samples_per_frame
    frames_per_piece = featurizer.rebase_samples // hop
    if featurizer.rebase_samples != featurizer.context_samples:
        raise ValueError("the unlimited lookahead case needs rebase = context (whole pieces)")
    out: list[FloatArray] = []
    for first in range(0, n, frames_per_piece):
        stop = min(len(audio), (first + frames_per_piece) * hop)
        while featurizer.frames_pushed * hop + hop <= stop:
            at = featurizer.frames_pushed * hop
            featurizer.push(audio[at : at + hop])
        featurizer.extend_tail(audio[featurizer.frames_pushed * hop : stop])
        out.extend(featurizer.conditioning(f) for f in range(first, min(n, first + frames_per_piece)))
    return out


def windows_of(encoder: Any, conds: FloatArray, device: torch.device) -> torch.Tensor:
    """(n, 81, C) conditionings -> (n, 10, 5, D) float32 windows (before the PE), as the backend does."""
    dtype = next(encoder.parameters()).dtype
    out = []
    with torch.no_grad():
        for start in range(0, len(conds), ENCODE_BATCH):
            c = torch.from_numpy(conds[start : start + ENCODE_BATCH]).to(device)
            mel = c[:, META_ROW, META_PAD][:, None, None].expand(len(c), 80, 3000).clone()
            width = min(c.shape[2], 3000)
            mel[:, :, :width] = c[:, :80, :width]
            states = encoder_states(encoder, mel.to(dtype))
            w = gather_windows(states, c[:, META_ROW, META_START].long(), c[:, META_ROW, META_REAL].long())
            out.append(w.float().reshape(len(c), 10, HIDDEN_STATES, -1))
    return torch.cat(out)


MEL_REACH = 12  # log-mel columns a window's 10 feature slots read on each side of 4 f (two convolutions)
FRAMES_PER_PIECE = 750


def offline_mel_windows(audio: FloatArray) -> FloatArray:
    """(n, 80, 24) float32: each frame's log-mel columns ``4 f - 12 .. 4 f + 11`` of its offline 30 s piece
    (zero outside the piece), the encoder input its window reads."""
    from lipcast.pipeline.musetalk.mel import reference_log_mel

    n, _ = frame_counts(len(audio))
    out = np.zeros((n, 80, 2 * MEL_REACH), np.float32)
    for first in range(0, n, FRAMES_PER_PIECE):
        piece = reference_log_mel(audio[first * 640 : (first + FRAMES_PER_PIECE) * 640])
        for f in range(first, min(n, first + FRAMES_PER_PIECE)):
            out[f] = _columns_around(piece, 4 * (f - first), piece.shape[1], 0.0)
    return out


def streamed_mel_windows(conds: FloatArray) -> FloatArray:
    """The same columns of each frame's live encoder input (its conditioning, silent columns filled in)."""
    out = np.zeros((len(conds), 80, 2 * MEL_REACH), np.float32)
    for i, cond in enumerate(conds):
        frame = (int(cond[META_ROW, META_START]) + 4) // 2  # relative to the origin
        full = np.full((80, 3000), cond[META_ROW, META_PAD], np.float32)
        full[:, : cond.shape[1]] = cond[:80, :3000]
        out[i] = _columns_around(full, 4 * frame, 3000, 0.0)
    return out


def _columns_around(mel: FloatArray, centre: int, width: int, fill: float) -> FloatArray:
    window = np.full((80, 2 * MEL_REACH), fill, np.float32)
    lo, hi = centre - MEL_REACH, centre + MEL_REACH
    a, b = max(lo, 0), min(hi, width)
    if b > a:
        window[:, a - lo : b - lo] = mel[:, a:b]
    return window


def mel_rel_l2(streamed: FloatArray, offline: FloatArray) -> npt.NDArray[np.float64]:
    """Per frame: |streamed - offline| / |offline| of the window's log-mel columns (weight-free)."""
    diff = np.linalg.norm((streamed - offline).reshape(len(offline), -1), axis=1)
    return (diff / np.maximum(np.linalg.norm(offline.reshape(len(offline), -1), axis=1), 1e-12)).astype(
        np.float64
    )


def frame_classes(audio: FloatArray, n: int) -> dict[str, npt.NDArray[np.bool_]]:
    hop = SAMPLE_RATE_HZ // 25
    rms = np.array([np.sqrt(np.mean(audio[f * hop : (f + 1) * hop] ** 2) + 1e-12) for f in range(n)])
    level = 20 * np.log10(rms / rms.max())
    t = (np.arange(n) + 0.5) / 25
    to_boundary = np.abs(t - np.round(t / 30.0) * 30.0)
    boundary = (to_boundary <= BOUNDARY_S) & (t > BOUNDARY_S)
    return {
        "speech": (level > SILENCE_DB) & ~boundary,
        "silence": (level <= SILENCE_DB) & ~boundary,
        "boundary": boundary,
    }


def metrics(streamed: torch.Tensor, offline: torch.Tensor) -> dict[str, npt.NDArray[np.float64]]:
    """Per frame and hidden state: relative L2 and the mean per-token cosine; (n, 5) each."""
    diff = (streamed - offline).norm(dim=(1, 3))
    rel = diff / offline.norm(dim=(1, 3)).clamp_min(1e-12)
    cos = torch.nn.functional.cosine_similarity(streamed, offline, dim=3, eps=1e-12).mean(dim=1)
    return {"rel_l2": rel.double().numpy(), "cosine": cos.double().numpy()}


def summarise(
    values: npt.NDArray[np.float64], mask: npt.NDArray[np.bool_], percentile: float = 95
) -> tuple[float, float] | None:
    """Mean and a percentile (the bad tail: 95 for distances, 5 for similarities) over the masked frames."""
    picked = values[mask]
    if picked.size == 0:
        return None
    return float(picked.mean()), float(np.percentile(picked, percentile))


def run(
    recordings: list[Path],
    candidates: list[Candidate],
    encoder: Any | None,
    device: torch.device,
    sanity: bool = True,
) -> dict[str, Any]:
    report: dict[str, Any] = {"recordings": [], "rows": []}
    per_candidate: dict[str, dict[str, list[npt.NDArray[np.float64]]]] = {}
    classes_all: list[dict[str, npt.NDArray[np.bool_]]] = []
    floor_rel: list[npt.NDArray[np.float64]] = []
    sanity_max = 0.0
    mel_rows: dict[str, list[npt.NDArray[np.float64]]] = {}
    half = _half_copy(encoder) if encoder is not None and device.type == "cuda" else None
    for path in recordings:
        audio = read_recording(path)
        n, _ = frame_counts(len(audio))
        offline_mel = offline_mel_windows(audio)
        classes = frame_classes(audio, n)
        classes_all.append(classes)
        report["recordings"].append(
            {
                "path": str(path),
                "seconds": len(audio) / SAMPLE_RATE_HZ,
                "frames": n,
                **{k: int(v.sum()) for k, v in classes.items()},
            }
        )
        for candidate in candidates:
            conds = stream_conditionings(audio, candidate)
            mel_rows.setdefault(candidate.label, []).append(
                mel_rel_l2(streamed_mel_windows(conds), offline_mel)
            )
            if encoder is None:
                continue
            streamed = windows_of(encoder, conds, device).cpu()
            offline = _offline(encoder, audio, device)
            result = metrics(streamed, offline)
            store = per_candidate.setdefault(candidate.label, {"rel_l2": [], "cosine": []})
            store["rel_l2"].append(result["rel_l2"])
            store["cosine"].append(result["cosine"])
        if encoder is None:
            continue
        offline = _offline(encoder, audio, device)
        if half is not None:
            floor_rel.append(metrics(offline_windows(half, audio, device).cpu().float(), offline)["rel_l2"])
        if sanity:
            exact = Candidate(None, 30.0, 30.0, "input")
            streamed = windows_of(encoder, stream_conditionings(audio, exact), device).cpu()
            away = ~classes["boundary"]
            sanity_max = max(sanity_max, float((streamed[away] - offline[away]).abs().max()))
    masks = {k: np.concatenate([c[k] for c in classes_all]) for k in ("speech", "silence", "boundary")}
    if floor_rel:
        stacked = np.concatenate(floor_rel)
        for layer in range(HIDDEN_STATES):
            report["rows"].append(
                _row("fp16 offline (precision floor)", layer, stacked[:, layer], None, masks)
            )
    for label, values in mel_rows.items():
        report["rows"].append(_row(label, "mel", np.concatenate(values), None, masks))
    for label, store in per_candidate.items():
        rel = np.concatenate(store["rel_l2"])
        cos = np.concatenate(store["cosine"])
        for layer in range(HIDDEN_STATES):
            report["rows"].append(_row(label, layer, rel[:, layer], cos[:, layer], masks))
    report["sanity_max_abs"] = sanity_max if sanity and encoder is not None else None
    return report


_OFFLINE_CACHE: dict[tuple[int, int], torch.Tensor] = {}


def _offline(encoder: Any, audio: FloatArray, device: torch.device) -> torch.Tensor:
    """The offline windows of ``audio`` (computed once per recording)."""
    key = (id(audio), len(audio))
    if key not in _OFFLINE_CACHE:
        _OFFLINE_CACHE.clear()
        _OFFLINE_CACHE[key] = offline_windows(encoder, audio, device).cpu()
    return _OFFLINE_CACHE[key]


def _row(label: str, layer: int | str, rel: Any, cos: Any, masks: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"candidate": label, "layer": layer}
    for name, mask in masks.items():
        row[f"{name}_rel_l2"] = summarise(rel, mask)
        row[f"{name}_cos"] = None if cos is None else summarise(cos, mask, 5)
    return row


def _half_copy(encoder: Any) -> Any:
    import copy

    return copy.deepcopy(encoder).half()


def format_table(report: dict[str, Any]) -> str:
    def cell(value: tuple[float, float] | None, digits: str = ".2e") -> str:
        return "-" if value is None else f"{value[0]:{digits}} / {value[1]:{digits}}"

    lines = [
        "| candidate | l | speech rel-L2 mean / p95 | silence rel-L2 | boundary rel-L2 "
        "| speech cosine mean / p5 |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['candidate']} | {row['layer']} | {cell(row['speech_rel_l2'])} "
            f"| {cell(row['silence_rel_l2'])} "
            f"| {cell(row['boundary_rel_l2'])} | {cell(row['speech_cos'], '.5f')} |"
        )
    if report.get("sanity_max_abs") is not None:
        lines.append(
            f"\nsanity (unlimited lookahead, the reference's pieces): max |streaming - offline| = "
            f"{report['sanity_max_abs']:.3g} (fp32; frames away from 30 s boundaries)"
        )
    return "\n".join(lines)


def parse_candidates(lookaheads: str, contexts: str, floors: str) -> list[Candidate]:
    """Every combination; a context is ``W`` or ``W/R`` (R: how far the origin moves; default W)."""
    out = []
    for look, context, floor in itertools.product(
        lookaheads.split(","), contexts.split(","), floors.split(",")
    ):
        value = None if look.strip() in ("inf", "unlimited") else float(look)
        width, _, rebase = context.partition("/")
        if value is None and rebase and float(rebase) != float(width):
            continue  # unlimited lookahead means whole pieces: rebase = context only
        out.append(Candidate(value, float(width), float(rebase) if rebase else None, floor.strip()))
    return out


def main(args: argparse.Namespace) -> int:
    from lipcast.pipeline.musetalk.weights import load_models, random_models

    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    encoder: Any = None
    if args.weights is not None:
        encoder = load_models(args.weights).whisper
    elif not args.mel_only:
        configs = tiny_configs() if args.random == "tiny" else full_configs()
        encoder = random_models(configs).whisper
    if encoder is not None:
        encoder = encoder.to(device).float().eval()
    candidates = parse_candidates(args.lookahead_ms, args.context_s, args.floor)
    report = run(args.recordings, candidates, encoder, device, sanity=not args.no_sanity)
    report["weights"] = (
        str(args.weights) if args.weights else ("none" if args.mel_only else f"random {args.random}")
    )
    report["device"] = str(device)
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0
