"""The probe against the in-process server: its black-box figures agree with the server's metadata."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lipcast.probe import plot, report
from lipcast.probe import summary as probe_summary
from lipcast.probe.client import CallOptions, call
from lipcast.probe.patterns import burst_pattern
from lipcast.server.app import create_app
from lipcast.server.config import Settings

pytestmark = [pytest.mark.usefixtures("loopback_ice"), pytest.mark.slow]


@pytest.mark.parametrize("video_release", ["aiortc", "marker"])
async def test_probe_figures_agree_with_the_metadata(aiohttp_client, tmp_path, video_release: str) -> None:
    client = await aiohttp_client(create_app(Settings()))
    url = str(client.make_url("")).rstrip("/")
    sent = burst_pattern(7.0, seed=3)
    recording = await call(
        url, sent, tail_s=0.8, http=client.session, options=CallOptions(video_release=video_release)
    )
    result = report.analyse(recording)

    assert len(result.bursts) >= 3
    for burst in result.bursts:
        # Black box (pixels) and metadata (the server's own account) name the same onset frame, +-1.
        assert burst.onset_frame is not None and burst.meta_onset_frame is not None, burst
        assert abs(burst.onset_frame - burst.meta_onset_frame) <= 1, burst
        assert burst.mouth_latency_ms is not None and 0 < burst.mouth_latency_ms < 1000
        assert burst.av_offset_ms is not None and abs(burst.av_offset_ms) < 80

    # The per-frame latency from metadata and the black-box mouth latency describe the same delay: the
    # mouth cannot move before the frame that carries the burst's first audio arrives.
    frame_p50 = float(np.median(result.frame_latency_ms))
    mouth_p50 = float(np.median([b.mouth_latency_ms for b in result.bursts]))
    assert abs(mouth_p50 - frame_p50) <= 3 * 40, (mouth_p50, frame_p50)
    print(
        f"probe: fps {result.fps:.2f}, freezes {result.freezes}, audio {result.audio_returned:.4f}, "
        f"mouth p50 {mouth_p50:.1f} ms, frame p50 {frame_p50:.1f} ms, "
        f"av {[b.av_offset_ms for b in result.bursts]}"
    )
    # Paced by the clock (a busy machine may skip a frame; half or double the rate is a bug), all the audio.
    assert 20 <= result.fps <= 26 and result.audio_returned >= 0.99, result

    # The stage breakdown adds up to the frame latency (the rest is "outside" the server) and names the fixed
    # delays: the built-in backend's lookahead and the default 40 ms render budget.
    stages = result.stages_ms
    assert {"buffer", "lookahead", "budget", "compose", "outside"} <= set(stages)
    assert len(stages["outside"]) == len(result.frame_latency_ms)
    assert all(v == stages["lookahead"][0] for v in stages["lookahead"]) and stages["budget"][0] == 40.0
    assert 0 <= float(np.median(stages["buffer"])) < 200 and float(np.median(stages["outside"])) > 0
    summary = probe_summary.summary([result], probe_summary.late_knee([result]))
    assert set(summary["stages_ms"]) >= {"buffer", "outside"}
    assert summary["metadata_agreement_within_1_frame"] == summary["metadata_compared"] == len(result.bursts)
    text = probe_summary.format_summary(url, summary, 0)
    assert "audio in -> mouth moves" in text and "p95" in text and "jitter buffer" in text
    # What --json writes: plain JSON, the per-frame lists summarised, the per-burst figures as measured.
    doc = json.loads(json.dumps({"summary": summary, "session": result.to_json()}))
    session = doc["session"]
    assert "frame_arrivals" not in session and session["fps"] == result.fps
    assert session["frame_latency_ms"]["count"] == len(result.frame_latency_ms)
    assert session["frame_latency_ms"]["p50"] == pytest.approx(frame_p50, abs=0.01)
    assert [b["onset_frame"] for b in session["bursts"]] == [b.onset_frame for b in result.bursts]
    assert doc["summary"]["metadata_compared"] == len(result.bursts)
    # The picture (lipcast[probe], which make installs) shows this call's measurements.
    assert plot.write_plots(tmp_path / "probe.png", [result], "test") == [
        tmp_path / "probe.png",
        tmp_path / "probe.svg",
    ]
    histogram, timeline = plot.figure([result], "test").axes
    frames = histogram.patches[1].get_data().values
    assert frames.sum() == pytest.approx(1.0) and len(result.frame_latency_ms) > 100
    lo, hi = histogram.get_xlim()
    assert lo <= min(result.frame_latency_ms) and max(result.frame_latency_ms) <= 1.1 * hi
    assert len(timeline.collections[0].get_segments()) == len(result.frame_arrivals) - 1
    assert plot.TIMELINE_XLABEL in (tmp_path / "probe.svg").read_text()

    assert probe_summary.check(summary, probe_summary.Thresholds(min_fps=20.0, min_audio_returned=0.99)) == []
    missed = probe_summary.check(
        summary, probe_summary.Thresholds(max_mouth_latency_p95_ms=1.0, max_av_offset_p95_ms=0.0)
    )
    assert len(missed) == 2


def test_burst_pattern_is_detected_as_bursts() -> None:
    audio = burst_pattern(8.0, seed=1)
    bursts = report.analysis.detect_bursts(audio)
    assert 3 <= len(bursts) <= 8
    assert bursts[0].start >= int(1.4 * 48_000)


def test_frames_are_numbered_from_the_streams_first_packet_not_the_first_frame_released() -> None:
    # On a narrow link the first frames can be lost: aiortc's receiver counts pts from the first frame it
    # released, 8 frames (8 x 3600 ticks) after the stream's first packet.
    from types import SimpleNamespace

    from aiortc.rtcrtpreceiver import TimestampMapper

    from lipcast.probe.client import first_frame_offset
    from lipcast.streaming.rtc import MarkerJitterBuffer

    buffer, mapper = MarkerJitterBuffer(), TimestampMapper()
    buffer.first_timestamp = (1 << 32) - 3600  # the RTP clock wraps in between
    mapper.map(7 * 3600)  # the first frame released: 8 frames later, across the wrap
    receiver = SimpleNamespace(
        _RTCRtpReceiver__jitter_buffer=buffer, _RTCRtpReceiver__timestamp_mapper=mapper
    )
    assert first_frame_offset(receiver) == 8 * 3600
    assert first_frame_offset(SimpleNamespace()) == 0
