"""Quality of the sharpen stage on one recording, on vs off (CPU is enough; no timing here).

    python benchmarks/sharpen_quality.py --weights animevideov3.pth --out results.json --png side.png

Same avatar (the built-in astronaut scaled to 512 x 512 px), same audio (tests.fakes.speech_pattern at
16 kHz: 1 s silence, 1.5 s speech, 1 s silence, 1.5 s speech, 1 s silence). The project ships no Wav2Lip
weights, and random ones give a mouth that does not follow the audio, so the 96 px faces come from the
built-in backend: each frame it renders (its mouth follows the audio) is cut to the face box and resized to
96 x 96 px, the face a Wav2Lip-class model emits, and pasted back through the Wav2Lip backend's paste
tables exactly as today (off) and through the sharpen stage at strength 0.7 with the restorer file given
(on). On the mouth region (from the avatar's mouth landmarks):

* sharpness: variance of the Laplacian of the grey picture, mean over all frames;
* idle flicker: mean |I_t - I_(t-1)| over the frames of the silent stretches (their first 0.2 s left out);
* audio-to-mouth correlation: each frame's mouth motion (mean |I_t - rest|, rest the median of the first 10
  frames) against the RMS of the frame's own 40 ms of audio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sharpen_bench import scaled_avatar  # noqa: E402
from lipcast.pipeline.backend import RenderItem  # noqa: E402
from lipcast.pipeline.builtin import BuiltinBackend  # noqa: E402
from lipcast.pipeline.compositing import paste_patch  # noqa: E402
from lipcast.pipeline.enhance.weights import load_restorer  # noqa: E402
from lipcast.pipeline.wav2lip.backend import Wav2LipBackend  # noqa: E402
from lipcast.pipeline.wav2lip.model import Wav2Lip  # noqa: E402
from lipcast.pipeline.wav2lip.paste import paste_faces  # noqa: E402
from tests.fakes import speech_pattern  # noqa: E402

PATTERN = [("silence", 1.0), ("speech", 1.5), ("silence", 1.0), ("speech", 1.5), ("silence", 1.0)]
HOP = 640  # 16 kHz samples per 25 fps frame
STRENGTH = 0.7


def mouth_box(avatar) -> tuple[int, int, int, int]:
    lx, ly, rx, ry, lip_y, chin_y = (float(v) for v in avatar.mouths[0])
    width = rx - lx
    x1, x2 = int(lx - 0.15 * width), int(rx + 0.15 * width)
    y1, y2 = int(min(ly, ry) - 0.25 * (chin_y - lip_y)), int(chin_y)
    return x1, y1, x2, y2


def laplacian_variance(region: np.ndarray) -> float:
    grey = cv2.cvtColor(region, cv2.COLOR_RGB2GRAY)
    return float(cv2.Laplacian(grey, cv2.CV_64F).var())


def builtin_frames(avatar, audio: np.ndarray) -> list[np.ndarray]:
    """The built-in backend's frames of ``audio`` (every frame rendered, its mouth following the audio)."""
    backend = BuiltinBackend(torch.device("cpu"))
    backend.add_avatar(avatar)
    featurizer = backend.new_featurizer()
    lag = -(-featurizer.lookahead_samples // HOP)
    padded = np.concatenate([audio, np.zeros(lag * HOP, np.float32)])
    frames = []
    for k in range(len(padded) // HOP):
        conditioning = featurizer.push(padded[k * HOP : (k + 1) * HOP])
        if k >= lag:
            patch = backend.render([RenderItem(avatar.name, 0, conditioning)])[0]
            frames.append(paste_patch(avatar.frames[0], patch))
    return frames


def pasted(backend: Wav2LipBackend, avatar, frames: list[np.ndarray], strength: float) -> list[np.ndarray]:
    """Each frame's face box at 96 px, pasted back as the Wav2Lip backend pastes (off), or sharpened."""
    entry = backend._avatars[avatar.name]
    x1, y1, x2, y2 = (int(v) for v in entry.boxes[0])
    row0 = int(entry.first_rows[0])
    first = backend.row_plan.first_row
    rows = torch.zeros(1, dtype=torch.int64)
    out = []
    for frame in frames:
        face = cv2.resize(frame[y1:y2, x1:x2], (96, 96), interpolation=cv2.INTER_AREA)[:, :, ::-1]
        face_t = torch.from_numpy(face.transpose(2, 0, 1)[None, :, first:].astype(np.float32) / 255.0)
        with torch.no_grad():
            canvas = paste_faces(face_t, backend._base[:1], backend._paste[:1])
            if strength > 0:
                assert backend.sharpener is not None
                backend.sharpener.apply(canvas, face_t, rows, backend._base, backend._paste, [strength])
        picture = avatar.frames[0].copy()
        picture[y1 + row0 : y2, x1:x2] = canvas[0].numpy()[: y2 - y1 - row0, : x2 - x1]
        out.append(picture)
    return out


def metrics(frames: list[np.ndarray], box, silent: np.ndarray, loudness: np.ndarray) -> dict[str, float]:
    x1, y1, x2, y2 = box
    regions = np.stack([f[y1:y2, x1:x2] for f in frames]).astype(np.float64)
    sharp = float(np.mean([laplacian_variance(f[y1:y2, x1:x2]) for f in frames]))
    steps = np.abs(np.diff(regions, axis=0)).mean(axis=(1, 2, 3))  # frame t vs t-1, t = 1..
    flicker = float(steps[silent[1:] & silent[:-1]].mean())
    motion = np.abs(regions - np.median(regions[:10], axis=0)).mean(axis=(1, 2, 3))
    correlation = float(np.corrcoef(motion, loudness)[0, 1])
    return {
        "laplacian_var": round(sharp, 2),
        "idle_flicker": round(flicker, 4),
        "audio_mouth_corr": round(correlation, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    restorer = load_restorer(args.weights)
    avatar = scaled_avatar()
    backend = Wav2LipBackend(Wav2Lip().state_dict(), batch_sizes=(1, 2, 4, 8), restorer=restorer)
    backend.add_avatar(avatar)
    audio = speech_pattern(PATTERN, rate_hz=16000)
    box = mouth_box(avatar)
    started = time.time()
    source = builtin_frames(avatar, audio)
    frames_n = len(source)
    loudness = np.sqrt((audio[: frames_n * HOP].reshape(frames_n, HOP).astype(np.float64) ** 2).mean(axis=1))
    t = (np.arange(frames_n) + 0.5) / 25.0
    silent = np.zeros(frames_n, dtype=bool)
    edge = 0.0
    for kind, seconds in PATTERN:
        if kind == "silence":
            silent |= (t >= edge + 0.2) & (t < edge + seconds)
        edge += seconds
    off = pasted(backend, avatar, source, 0.0)
    on = pasted(backend, avatar, source, STRENGTH)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "restorer": restorer.describe(),
        "strength": STRENGTH,
        "frames": frames_n,
        "mouth_box": box,
        "off": metrics(off, box, silent, loudness),
        "on": metrics(on, box, silent, loudness),
    }
    flicker_off = result["off"]["idle_flicker"]
    result["ratios"] = {
        "laplacian_on_off": round(result["on"]["laplacian_var"] / result["off"]["laplacian_var"], 3),
        "flicker_on_off": round(result["on"]["idle_flicker"] / flicker_off, 3) if flicker_off else None,
        "corr_on_minus_off": round(result["on"]["audio_mouth_corr"] - result["off"]["audio_mouth_corr"], 4),
    }
    result["wall_s"] = round(time.time() - started, 1)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    if args.png is not None:
        speech_frame = int(np.argmax(loudness))
        x1, y1, x2, y2 = (int(v) for v in backend._avatars[avatar.name].boxes[0])
        crops = [off[0], on[0], off[speech_frame], on[speech_frame]]
        row = np.concatenate([c[y1:y2, x1:x2] for c in crops], 1)
        row = cv2.resize(row, None, fx=2, fy=2, interpolation=cv2.INTER_NEAREST)
        args.png.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(args.png), cv2.cvtColor(row, cv2.COLOR_RGB2BGR))


if __name__ == "__main__":
    main()
