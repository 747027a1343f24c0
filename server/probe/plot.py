"""The probe's picture: a latency histogram and a per-session timeline, drawn with OpenCV (no plotting
library needed)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from server.probe.report import GAP_MS, CallReport

WIDTH, HEIGHT = 1200, 860
MARGIN = 70
WHITE = (255, 255, 255)
INK = (40, 40, 40)
GRID = (225, 225, 225)
BLUE = (200, 120, 30)  # BGR
ORANGE = (30, 140, 240)
GREEN = (60, 170, 60)
RED = (40, 40, 220)
FONT = cv2.FONT_HERSHEY_SIMPLEX


def _text(
    img: npt.NDArray[np.uint8],
    text: str,
    xy: tuple[int, int],
    scale: float = 0.5,
    color: tuple[int, int, int] = INK,
    thickness: int = 1,
) -> None:
    cv2.putText(img, text, xy, FONT, scale, color, thickness, cv2.LINE_AA)


def _histogram(
    img: npt.NDArray[np.uint8],
    box: tuple[int, int, int, int],
    series: list[tuple[str, list[float], tuple[int, int, int]]],
) -> None:
    x0, y0, x1, y1 = box
    values = [v for _, vs, _ in series for v in vs]
    if not values:
        _text(img, "no latency samples", (x0 + 10, (y0 + y1) // 2))
        return
    lo = max(0.0, np.floor(float(np.min(values)) * 0.8 / 10.0) * 10.0)
    hi = float(np.percentile(values, 99.5)) * 1.1 + 1.0
    bins = np.linspace(lo, hi, 41)
    counts = [np.histogram(np.clip(vs, lo, hi), bins)[0] / max(1, len(vs)) for _, vs, _ in series]
    top = max(float(c.max()) for c in counts) or 1.0
    for i in range(6):  # grid and axis labels
        y = int(y1 - (y1 - y0) * i / 5)
        cv2.line(img, (x0, y), (x1, y), GRID, 1)
        _text(img, f"{top * i / 5:.0%}", (x0 - 55, y + 5), 0.4)
    for i in range(9):
        x = int(x0 + (x1 - x0) * i / 8)
        _text(img, f"{lo + (hi - lo) * i / 8:.0f}", (x - 12, y1 + 18), 0.4)
    width = (x1 - x0) / (len(bins) - 1)
    for s, ((name, vs, color), c) in enumerate(zip(series, counts, strict=True)):
        for i, share in enumerate(c):
            bx = int(x0 + i * width + s * width / len(series))
            by = int(y1 - (y1 - y0) * share / top)
            cv2.rectangle(img, (bx, by), (int(bx + width / len(series)) - 1, y1), color, -1)
        p50 = float(np.percentile(vs, 50)) if vs else 0.0
        p95 = float(np.percentile(vs, 95)) if vs else 0.0
        _text(
            img,
            f"{name}: n={len(vs)} p50={p50:.0f} p95={p95:.0f} ms",
            (x0 + 12, y0 + 22 + 22 * s),
            0.5,
            color,
            1,
        )
    cv2.rectangle(img, (x0, y0), (x1, y1), INK, 1)
    _text(img, "milliseconds", ((x0 + x1) // 2 - 40, y1 + 38), 0.45)


def _timeline(img: npt.NDArray[np.uint8], box: tuple[int, int, int, int], reports: list[CallReport]) -> None:
    x0, y0, x1, y1 = box
    starts = [r.frame_arrivals[0] for r in reports if r.frame_arrivals]
    ends = [r.frame_arrivals[-1] for r in reports if r.frame_arrivals]
    if not starts:
        return
    t0, t1 = min(starts), max(ends)
    span = max(1e-3, t1 - t0)
    lane = (y1 - y0) / max(1, len(reports))
    for i in range(11):
        x = int(x0 + (x1 - x0) * i / 10)
        cv2.line(img, (x, y0), (x, y1), GRID, 1)
        _text(img, f"{span * i / 10:.1f}", (x - 10, y1 + 18), 0.4)
    for row, report in enumerate(reports):
        yc = int(y0 + lane * (row + 0.5))
        half = max(2, int(lane * 0.3))
        arrivals = np.asarray(report.frame_arrivals)
        gaps = np.diff(arrivals) * 1000.0
        for a, b, gap in zip(arrivals[:-1], arrivals[1:], gaps, strict=True):
            xa = int(x0 + (a - t0) / span * (x1 - x0))
            xb = int(x0 + (b - t0) / span * (x1 - x0))
            cv2.line(img, (xa, yc), (max(xa, xb), yc), RED if gap > GAP_MS else GREEN, max(1, half))
        for burst in report.bursts:
            sent_at = report.sent_started_at + burst.start_ms / 1000.0
            xs = int(x0 + (sent_at - t0) / span * (x1 - x0))
            cv2.line(img, (xs, yc - half - 3), (xs, yc + half + 3), BLUE, 2)
        if len(reports) <= 24:
            _text(img, f"s{row + 1}", (x0 - 30, yc + 5), 0.4)
    cv2.rectangle(img, (x0, y0), (x1, y1), INK, 1)
    _text(
        img,
        "seconds since the first frame (green: frames on time, red: gaps > 60 ms, blue: bursts sent)",
        (x0, y1 + 38),
        0.45,
    )


def write_png(path: Path, reports: list[CallReport], title: str) -> None:
    img = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    _text(img, title, (MARGIN, 35), 0.7, INK, 2)
    mouth = [b.mouth_latency_ms for r in reports for b in r.bursts if b.mouth_latency_ms is not None]
    frame = [v for r in reports for v in r.frame_latency_ms]
    _text(img, "audio in -> video out latency", (MARGIN, 70), 0.55, INK, 1)
    _histogram(
        img,
        (MARGIN, 85, WIDTH - 30, 420),
        [("mouth onset (black box)", mouth, BLUE), ("every frame (metadata)", frame, ORANGE)],
    )
    _text(img, f"per-session timeline ({len(reports)} sessions)", (MARGIN, 490), 0.55, INK, 1)
    _timeline(img, (MARGIN, 505, WIDTH - 30, HEIGHT - 60), reports)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), img):
        raise OSError(f"cannot write {path}")
