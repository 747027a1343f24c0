"""The probe's picture shows the measurements: axis ranges, bars and timeline segments come from the data."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from lipcast.probe import plot
from lipcast.probe.report import GAP_MS, BurstResult, CallReport

matplotlib = pytest.importorskip("matplotlib", reason="the probe's plots need lipcast[probe]")


def a_report(
    session: str, start_s: float, frame_gaps_s: list[float], latencies_ms: list[float]
) -> CallReport:
    arrivals = list(start_s + np.concatenate([[0.0], np.cumsum(frame_gaps_s)]))
    bursts = [
        BurstResult(500.0, 400.0, latencies_ms[0] + 30.0, 5.0, 12, 12),
        BurstResult(1500.0, 300.0, None, None, None, None),  # never seen: not in the histogram
    ]
    return CallReport(
        session, 2.0, len(arrivals), 25.0, 0, 0, 0.0, 0, 0.0, 1.0, 1.0, 0, [], 0,
        frame_latency_ms=latencies_ms, bursts=bursts, sent_started_at=start_s - 0.1, frame_arrivals=arrivals,
    )  # fmt: skip


@pytest.fixture
def reports() -> list[CallReport]:
    steady = a_report("a", 100.0, [0.04] * 50, [150.0 + i for i in range(50)])
    gappy = a_report("b", 100.5, [0.04] * 20 + [0.3] + [0.04] * 20, [200.0 + 2 * i for i in range(41)])
    return [steady, gappy]


def test_the_histogram_shows_the_latencies(reports: list[CallReport]) -> None:
    fig = plot.figure(reports, "probe test")
    histogram = fig.axes[0]
    mouth, frame = plot.latency_series(reports)
    assert sorted(mouth) == [180.0, 230.0] and len(frame) == 91
    lo, hi = histogram.get_xlim()
    assert lo <= min(frame + mouth) and hi >= max(frame + mouth)
    assert hi < 2 * max(frame + mouth)  # fitted to the data, not a fixed range
    bars = histogram.patches  # one step patch per series, shares of that series' samples
    assert len(bars) == 2
    for patch, values in zip(bars, (mouth, frame), strict=True):
        shares, edges = patch.get_data().values, patch.get_data().edges
        assert shares.sum() == pytest.approx(1.0)
        assert edges[0] == pytest.approx(lo) and edges[-1] == pytest.approx(hi)
        # The tallest bin holds the samples it should.
        top = int(np.argmax(shares))
        inside = [v for v in values if edges[top] <= v < edges[top + 1]]
        assert shares[top] == pytest.approx(len(inside) / len(values))
    legend = [t.get_text() for t in histogram.get_legend().get_texts()]
    assert legend[0].startswith("mouth onset (black box): n=2 ")
    assert legend[1] == f"every frame (metadata): n=91 p50={np.percentile(frame, 50):.0f} " + (
        f"p95={np.percentile(frame, 95):.0f} ms"
    )
    assert histogram.get_xlabel() == plot.HISTOGRAM_XLABEL and histogram.get_ylabel() == plot.HISTOGRAM_YLABEL


def test_the_timeline_shows_every_frame_and_the_gap(reports: list[CallReport]) -> None:
    timeline = plot.figure(reports, "probe test").axes[1]
    first, last = reports[0].frame_arrivals[0], reports[1].frame_arrivals[-1]
    assert timeline.get_xlim() == pytest.approx((0.0, last - first))
    assert timeline.get_ylim() == (1.5, -0.5)  # two lanes, session 1 on top
    assert [t.get_text() for t in timeline.get_yticklabels()] == ["s1", "s2"]
    (frames,) = timeline.collections[:1]
    segments = frames.get_segments()
    assert len(segments) == 50 + 41  # one per interval between two arrivals
    colors = [tuple(c) for c in frames.get_colors()]
    red = matplotlib.colors.to_rgba(plot.GAP)
    gaps = [s for s, c in zip(segments, colors, strict=True) if c == red]
    assert len(gaps) == 1  # the 300 ms hole in session 2, nothing else
    (start, _), (end, _) = gaps[0]
    assert (end - start) * 1000.0 == pytest.approx(300.0) and (end - start) * 1000.0 > GAP_MS
    assert gaps[0][0][1] == 1  # on session 2's lane
    bursts = timeline.collections[1].get_offsets()
    expected = [r.sent_started_at + b.start_ms / 1000.0 - first for r in reports for b in r.bursts]
    np.testing.assert_allclose(np.asarray(bursts)[:, 0], expected)
    assert timeline.get_xlabel() == plot.TIMELINE_XLABEL


def test_writes_png_and_svg_with_the_labels(reports: list[CallReport], tmp_path: Path) -> None:
    written = plot.write_plots(tmp_path / "out" / "probe.png", reports, "lipcast probe: test")
    png, svg = written
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and svg.suffix == ".svg"
    text = svg.read_text()
    for label in (plot.HISTOGRAM_XLABEL, plot.HISTOGRAM_YLABEL, plot.TIMELINE_XLABEL, "lipcast probe: test"):
        assert label.replace(">", "&gt;") in text, label
    assert "every frame (metadata): n=91" in text


def test_without_matplotlib_the_probe_says_so_once(
    reports: list[CallReport],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    plot._say_plots_need_matplotlib.cache_clear()
    with caplog.at_level(logging.WARNING, logger="lipcast.probe.plot"):
        assert plot.write_plots(tmp_path / "a.png", reports, "t") == []
        assert plot.write_plots(tmp_path / "b.png", reports, "t") == []
    said = [r.getMessage() for r in caplog.records if "matplotlib" in r.getMessage()]
    assert said == ["no plots: they need matplotlib (pip install 'lipcast[probe]')"]
    assert list(tmp_path.iterdir()) == []
    plot._say_plots_need_matplotlib.cache_clear()
