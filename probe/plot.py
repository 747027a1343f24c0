"""The probe's picture: a latency histogram and a per-session timeline, drawn with matplotlib (Agg).

matplotlib is optional (``pip install 'lipcast[probe]'``): without it the probe still measures and reports,
and says once in its log that the plots need the extra. ``--png out.png`` writes ``out.png`` and, next to
it, ``out.svg`` (text kept as text, so the labels can be searched and copied).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lipcast.probe.report import GAP_MS, CallReport

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn: it is optional
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'lipcast[probe]'"
FIGURE_SIZE_IN = (12.0, 8.6)
DPI = 100  # 1200 x 860 pixels
HISTOGRAM_BINS = 40
MAX_LABELLED_SESSIONS = 24  # more lanes than this: no per-lane tick labels
ON_TIME, GAP, BURST = "tab:green", "tab:red", "tab:blue"
SERIES = (("mouth onset (black box)", "tab:blue"), ("every frame (metadata)", "tab:orange"))
HISTOGRAM_XLABEL = "audio in -> video out latency (ms)"
HISTOGRAM_YLABEL = "share of samples"
TIMELINE_XLABEL = "seconds since the first frame"
TIMELINE_YLABEL = "session"


def latency_series(reports: list[CallReport]) -> tuple[list[float], list[float]]:
    """(mouth onset latencies of every burst, per-frame latencies) over all sessions, in ms."""
    mouth = [b.mouth_latency_ms for r in reports for b in r.bursts if b.mouth_latency_ms is not None]
    frame = [v for r in reports for v in r.frame_latency_ms]
    return mouth, frame


def figure(reports: list[CallReport], title: str) -> Figure:
    """The picture as a figure on an Agg canvas: ``axes[0]`` the histogram, ``axes[1]`` the timeline."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    histogram, timeline = fig.subplots(2, 1, height_ratios=(1.0, 1.1))
    _histogram(histogram, latency_series(reports))
    _timeline(timeline, reports)
    return fig


def _histogram(ax: Axes, series: tuple[list[float], list[float]]) -> None:
    from matplotlib.ticker import PercentFormatter

    ax.set_title("audio in -> video out latency", loc="left")
    ax.set_xlabel(HISTOGRAM_XLABEL)
    ax.set_ylabel(HISTOGRAM_YLABEL)
    values = [v for vs in series for v in vs]
    if not values:
        ax.text(0.5, 0.5, "no latency samples", transform=ax.transAxes, ha="center")
        return
    lo = max(0.0, float(np.floor(min(values) * 0.8 / 10.0) * 10.0))
    # Each series' own tail, so a few mouth onsets are not hidden beyond thousands of frame latencies.
    hi = max(float(np.percentile(vs, 99.5)) for vs in series if vs) * 1.1 + 1.0
    edges = np.linspace(lo, hi, HISTOGRAM_BINS + 1)
    for (name, color), vs in zip(SERIES, series, strict=True):
        if not vs:
            continue
        counts = np.histogram(np.clip(vs, lo, hi), edges)[0] / len(vs)
        p50, p95 = np.percentile(vs, [50, 95])
        label = f"{name}: n={len(vs)} p50={p50:.0f} p95={p95:.0f} ms"
        ax.stairs(counts, edges, fill=True, alpha=0.45, color=color, label=label)
        ax.axvline(float(p95), color=color, linestyle="--", linewidth=1)  # dashed: its p95
    ax.set_xlim(lo, hi)
    ax.set_ylim(0.0, None)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", title="dashed lines: p95")


def _timeline(ax: Axes, reports: list[CallReport]) -> None:
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    ax.set_title(f"per-session timeline ({len(reports)} sessions)", loc="left")
    ax.set_xlabel(TIMELINE_XLABEL)
    ax.set_ylabel(TIMELINE_YLABEL)
    started = [r for r in reports if r.frame_arrivals]
    if not started:
        ax.text(0.5, 0.5, "no frames received", transform=ax.transAxes, ha="center")
        return
    t0 = min(r.frame_arrivals[0] for r in started)
    t1 = max(r.frame_arrivals[-1] for r in started)
    segments, colors, bursts_x, bursts_y = [], [], [], []
    for row, report in enumerate(reports):
        arrivals = np.asarray(report.frame_arrivals) - t0
        gaps_ms = np.diff(arrivals) * 1000.0
        for a, b, gap in zip(arrivals[:-1], arrivals[1:], gaps_ms, strict=True):
            segments.append([(a, row), (b, row)])
            colors.append(GAP if gap > GAP_MS else ON_TIME)
        for burst in report.bursts:
            bursts_x.append(report.sent_started_at + burst.start_ms / 1000.0 - t0)
            bursts_y.append(row)
    lane_width = max(1.0, 120.0 / max(1, len(reports)))
    ax.add_collection(LineCollection(segments, colors=colors, linewidths=lane_width, antialiaseds=False))
    ax.scatter(bursts_x, bursts_y, marker="|", s=(lane_width * 2.5) ** 2, color=BURST, zorder=3)
    ax.set_xlim(0.0, max(1e-3, t1 - t0))
    ax.set_ylim(len(reports) - 0.5, -0.5)  # session 1 at the top
    if len(reports) <= MAX_LABELLED_SESSIONS:
        ax.set_yticks(range(len(reports)), [f"s{i + 1}" for i in range(len(reports))])
    ax.grid(True, axis="x", alpha=0.3)
    handles = [
        Line2D([], [], color=ON_TIME, linewidth=4, label="frames on time"),
        Line2D([], [], color=GAP, linewidth=4, label=f"gap > {GAP_MS:.0f} ms"),
        Line2D([], [], color=BURST, marker="|", linestyle="none", markersize=12, label="burst sent"),
    ]
    ax.legend(handles=handles, loc="upper right", ncols=3)


@functools.cache
def _say_plots_need_matplotlib() -> None:
    logger.warning("no plots: they need matplotlib (%s)", INSTALL_HINT)


def write_plots(path: Path, reports: list[CallReport], title: str) -> list[Path]:
    """Write the picture as ``path`` (PNG) and the same with ``.svg``; the files written (none without
    matplotlib, which is then said once in the log)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        _say_plots_need_matplotlib()
        return []
    from matplotlib import rc_context

    fig = figure(reports, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    svg = path.with_suffix(".svg")
    fig.savefig(path, format="png")
    with rc_context({"svg.fonttype": "none"}):  # labels stay text in the SVG
        fig.savefig(svg, format="svg")
    return [path, svg]
