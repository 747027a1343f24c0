"""Turn one recorded call into figures: per burst (latency, A/V offset), per call (fps, gaps, audio).

Two independent views of the same call:

* **black box** — from pixels and samples only: when a burst's first sample left the client, when the first
  frame with a moving mouth arrived, when the burst's returned audio arrived;
* **metadata** — from the server's per-frame data-channel messages: which input sample each frame carries
  and whether its mouth is open. Each is a check on the other (they must agree within a frame).

Frames are matched to the server's frame numbers through their RTP-derived pts: the first frame received is
the first frame sent (the server holds metadata back until the channel opens, so its first message is that
frame's), and pts advance by 3600 (90 kHz) per frame.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ, MEDIA_SAMPLES_PER_FRAME, VIDEO_PTS_PER_FRAME
from lipcast.probe import analysis
from lipcast.probe.client import CallRecording
from lipcast.streaming.wire import MetaMessage

OPUS_DELAY_SAMPLES = 312  # libopus's algorithmic delay at 48 kHz (6.5 ms), once per encode/decode hop
GAP_MS = 60.0  # a frame arriving this long after the previous one is a gap (1.5 frames)
FREEZE_MS = 250.0  # ... and this long, a freeze
AUDIO_GAP_MS = 60.0


@dataclass
class BurstResult:
    start_ms: float  # in the sent audio
    duration_ms: float
    mouth_latency_ms: float | None  # burst leaves the client -> first moving mouth arrives
    av_offset_ms: float | None  # mouth onset arrival - returned audio onset arrival (+: video later)
    onset_frame: int | None  # server frame number of that first moving frame (black box)
    meta_onset_frame: int | None  # first frame whose metadata shows the mouth open for this burst


@dataclass
class CallReport:
    session_id: str
    duration_s: float
    frames: int
    fps: float
    frame_gaps: int
    freezes: int
    max_frame_gap_ms: float
    late_frames: int  # per metadata: render not ready, previous frame repeated
    audio_lag_ms: float  # received-stream offset of the sent audio
    audio_correlation: float
    audio_returned: float  # share of sent audio blocks (with sound) found in the returned audio
    audio_bursts_reordered: int  # audio blocks that came back before the end of the one sent before
    audio_burst_lags_ms: list[float]  # each burst's own offset in the received stream
    audio_gaps: int
    audio_delay_ms: list[float] = field(default_factory=list)  # input -> output, per received chunk
    frame_latency_ms: list[float] = field(default_factory=list)  # per frame: its audio sent -> it arrived
    # Per frame with audio, where that frame latency went: the server's stages from its metadata and
    # "outside" (the rest: client packetisation, network both ways, receive jitter buffers, decoders, encode).
    stages_ms: dict[str, list[float]] = field(default_factory=dict)
    bursts: list[BurstResult] = field(default_factory=list)
    started_at: float = 0.0  # first frame's arrival (monotonic s)
    sent_started_at: float = 0.0  # when the first audio packet left
    frame_arrivals: list[float] = field(default_factory=list)
    network: dict[str, dict[str, float | int]] = field(default_factory=dict)  # impairment, per direction
    # Mouth motion against the sent speech's loudness at one fixed delay (analysis.mouth_speech_correlation).
    mouth_correlation: float | None = None
    mouth_correlation_delay_ms: float | None = None
    # For an impairment with an end (``until=``): the delay before, during, after, and how soon it was back.
    delay_recovery: dict[str, float | None] | None = None
    # For a rate-limited downlink: what the server sent per second, and whether the delay kept growing.
    downlink_rate: dict[str, float | None] | None = None
    # The server's packet stage for this call's inbound audio (the last metadata's ``rx``): lost, FEC, late...
    server_rx: dict[str, float] = field(default_factory=dict)
    # Each time the probe's receiver gave up on a lost packet (PLI): ms from the last good frame to the
    # keyframe that mended the picture (analysis.picture_recoveries_ms).
    picture_recoveries_ms: list[float] = field(default_factory=list)
    lost_keyframe_mended_ms: float | None = None  # --lose-keyframe-at-s: the same for the keyframe lost

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("frame_arrivals")
        for key in ("audio_delay_ms", "frame_latency_ms"):
            out[key] = summarize(getattr(self, key))
        out["stages_ms"] = {name: summarize(values) for name, values in self.stages_ms.items()}
        return out


def percentiles(values: list[float] | np.ndarray, qs: tuple[int, ...] = (50, 95, 99)) -> dict[str, float]:
    arr = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if arr.size == 0:
        return {}
    return {f"p{q}": round(float(np.percentile(arr, q)), 2) for q in qs}


def summarize(values: list[float] | np.ndarray) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {"count": 0}
    return {"count": int(arr.size), "mean": round(float(arr.mean()), 2), **percentiles(arr)}


def frame_numbers(recording: CallRecording) -> np.ndarray:
    """The server's frame number of every received frame (-1 when unknown)."""
    if not recording.meta or not recording.video.pts:
        return np.full(len(recording.video.pts), -1)
    first = int(recording.meta[0][1]["frame"])
    pts = np.asarray(recording.video.pts, dtype=np.int64) + recording.video.pts_offset
    return first + pts // VIDEO_PTS_PER_FRAME


def motion_threshold(motion: np.ndarray, silent: np.ndarray) -> float:
    """Moving = well above the codec noise seen while the mouth is known to rest."""
    noise = motion[silent] if silent.any() else motion[: max(1, len(motion) // 10)]
    return max(3.0, 4.0 * float(np.percentile(noise, 99)))


def analyse(recording: CallRecording) -> CallReport:
    sent = recording.sent
    received = recording.audio.samples()
    lag, correlation = analysis.align(sent, received)
    bursts = analysis.detect_bursts(sent)
    burst_lags = [burst_lag for burst_lag, _ in analysis.burst_lags(sent, received, bursts, lag)]
    returned, _, reordered, _ = analysis.returned_by_burst(sent, received, bursts, burst_lags)
    arrivals = np.asarray(recording.video.arrived_at)
    gaps = analysis.frame_gaps_ms(recording.video.arrived_at)
    audio_gaps = np.diff(np.asarray(recording.audio.arrived_at)) * 1000.0
    meta = {int(m["frame"]): m for _, m in recording.meta}
    numbers = frame_numbers(recording)

    # Per frame: when its audio left the client (metadata) -> when it arrived.
    frame_latency = []
    frame_latency_at = []
    stages: dict[str, list[float]] = {}
    open_by_frame = {}
    for i, number in enumerate(numbers):
        m = meta.get(int(number))
        if m is None:
            continue
        open_by_frame[int(number)] = bool(m.get("active"))
        audio_ms = m.get("audio_ms")
        if audio_ms is not None:
            sent_at = analysis.sent_time(recording, round(audio_ms * 48) - OPUS_DELAY_SAMPLES)
            if sent_at is not None:
                frame_latency.append((arrivals[i] - sent_at) * 1000.0)
                frame_latency_at.append(float(arrivals[i]))
                add_stages(stages, m.get("stages_ms") or {}, frame_latency[-1])

    motion = analysis.mouth_motion(recording) if recording.video.regions else np.zeros(0)
    silent = np.asarray([not open_by_frame.get(int(n), True) for n in numbers], dtype=bool)
    threshold = motion_threshold(motion, silent) if len(motion) else 0.0
    latencies = analysis.onset_latencies_ms(recording, bursts, motion, threshold)
    delay_times, audio_delays = analysis.audio_delays_ms(recording, lag, bursts, burst_lags)
    recovery = _delay_recovery(recording, delay_times, audio_delays)
    mouth_corr = mouth_delay = None
    if len(motion) and len(audio_delays):
        mouth_corr, mouth_delay = analysis.mouth_speech_correlation(
            sent, recording.source.sent_at, arrivals, motion, float(np.median(audio_delays))
        )

    results = []
    for burst, latency, burst_lag in zip(bursts, latencies, burst_lags, strict=True):
        onset_frame = av_offset = None
        if latency is not None:
            t_on = analysis.sent_time(recording, burst.start)
            assert t_on is not None
            index = int(np.argmin(np.abs(arrivals - (t_on + latency / 1000.0))))
            onset_frame = int(numbers[index]) if numbers[index] >= 0 else None
            audio_at = analysis.received_time(recording, burst.start + burst_lag)
            if audio_at is not None:
                av_offset = (arrivals[index] - audio_at) * 1000.0
        results.append(
            BurstResult(
                start_ms=burst.start * 1000.0 / MEDIA_SAMPLE_RATE_HZ,
                duration_ms=(burst.end - burst.start) * 1000.0 / MEDIA_SAMPLE_RATE_HZ,
                mouth_latency_ms=latency,
                av_offset_ms=av_offset,
                onset_frame=onset_frame,
                meta_onset_frame=_meta_onset(recording, burst, meta),
            )
        )
    duration = float(arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else 0.0
    return CallReport(
        session_id=recording.session_id,
        duration_s=round(duration, 3),
        frames=len(arrivals),
        fps=round(analysis.received_fps(recording.video.arrived_at), 2),
        frame_gaps=int((gaps > GAP_MS).sum()),
        freezes=int((gaps > FREEZE_MS).sum()),
        max_frame_gap_ms=round(float(gaps.max()), 1) if len(gaps) else 0.0,
        late_frames=sum(1 for m in meta.values() if m.get("late")),
        audio_lag_ms=round(lag * 1000.0 / MEDIA_SAMPLE_RATE_HZ, 2),
        audio_correlation=round(correlation, 4),
        audio_returned=round(returned, 4),
        audio_bursts_reordered=reordered,
        audio_burst_lags_ms=[round(v * 1000.0 / MEDIA_SAMPLE_RATE_HZ, 2) for v in burst_lags],
        audio_gaps=int((audio_gaps > AUDIO_GAP_MS).sum()),
        audio_delay_ms=[float(v) for v in audio_delays],
        frame_latency_ms=frame_latency,
        stages_ms=stages,
        bursts=results,
        started_at=float(arrivals[0]) if len(arrivals) else 0.0,
        sent_started_at=recording.source.sent_at[0] if recording.source.sent_at else 0.0,
        frame_arrivals=[float(a) for a in arrivals],
        network=recording.network.stats_json() if recording.network is not None else {},
        mouth_correlation=None if mouth_corr is None else round(mouth_corr, 4),
        mouth_correlation_delay_ms=mouth_delay,
        delay_recovery=None if recovery is None else asdict(recovery),
        downlink_rate=_downlink_rate(recording, frame_latency_at, frame_latency),
        picture_recoveries_ms=analysis.picture_recoveries_ms(
            list(recording.video.arrived_at),
            list(recording.video.keyframes_at),
            list(recording.video.give_ups),
        ),
        lost_keyframe_mended_ms=next(
            iter(
                analysis.picture_recoveries_ms(
                    list(recording.video.arrived_at),
                    list(recording.video.keyframes_at),
                    list(recording.video.lost_keyframe_at),
                )
            ),
            None,
        ),
        server_rx=next((dict(m["rx"]) for _, m in reversed(recording.meta) if "rx" in m), {}),
    )


def _downlink_rate(
    recording: CallRecording, latency_at: list[float], latency_ms: list[float]
) -> dict[str, float | None] | None:
    """Against the probe's downlink rate limit: the server's sending rate (bytes entering the limited link)
    per second, video and all media, the first second from which the video stayed under the cap, and the
    frame latency (median) of the call's first and second halves after its first 5 s (growing: the server
    sends more than the link takes)."""
    network = recording.network
    path = network.down if network is not None else None
    if path is None or path.impairment.rate_kbps is None or path.stats.first_packet_at is None:
        return None
    cap = path.impairment.rate_kbps
    kbps = [b * 8 / 1000.0 for b in path.stats.bytes_by_second[:-1]]  # the last second is partial
    video_kbps = [b * 8 / 1000.0 for b in path.stats.video_bytes_by_second[:-1]]
    start = path.stats.first_packet_at + 5.0
    times, values = np.asarray(latency_at), np.asarray(latency_ms)
    kept = times >= start
    halves: list[float | None] = [None, None]
    if kept.sum() >= 20:
        middle = float(np.median(times[kept]))
        for k, part in enumerate((kept & (times < middle), kept & (times >= middle))):
            halves[k] = round(float(np.median(values[part])), 1)
    return {
        "cap_kbps": cap,
        "sent_kbps_p50": _p50_after_5s(kbps),
        "sent_kbps_max_after_5s": round(max(kbps[5:]), 1) if len(kbps) > 5 else None,
        "video_kbps_p50": _p50_after_5s(video_kbps),
        "video_kbps_max_after_5s": round(max(video_kbps[5:]), 1) if len(video_kbps) > 5 else None,
        "under_cap_from_s": _under_from(video_kbps, cap),
        "all_media_under_cap_from_s": _under_from(kbps, cap),
        "frame_latency_first_half_ms": halves[0],
        "frame_latency_second_half_ms": halves[1],
    }


def _p50_after_5s(kbps: list[float]) -> float | None:
    return round(float(np.median(kbps[5:])), 1) if len(kbps) > 5 else None


def _under_from(kbps: list[float], cap: float) -> float | None:
    """The first second from which every later second stayed at or under ``cap`` (None: the last did not)."""
    under_from = None
    for second in range(len(kbps) - 1, -1, -1):
        if kbps[second] > cap:
            break
        under_from = float(second)
    return under_from


def _delay_recovery(
    recording: CallRecording, times: np.ndarray, delays_ms: np.ndarray
) -> analysis.DelayRecovery | None:
    """The audio delay around the probe's impaired stretch, when the impairment had an end."""
    network = recording.network
    if network is None:
        return None
    for path in (network.up, network.down):
        if path is None or path.impairment.until_s is None:
            continue
        stretch = path.stats.impaired_between(path.impairment)
        if stretch is not None and stretch[1] is not None:
            return analysis.delay_recovery(times, delays_ms, stretch[0], stretch[1])
    return None


# The server stages that lie on a frame's audio path (in order), from the metadata's stages_ms.
PATH_STAGES = ("buffer", "lookahead", "produce_late", "budget", "compose")


def add_stages(stages: dict[str, list[float]], frame_stages: dict[str, float], latency_ms: float) -> None:
    """Record one frame's path stages and the rest of its latency ("outside" the server)."""
    if "lookahead" not in frame_stages:  # an older server: no breakdown
        return
    inside = 0.0
    for name in (*PATH_STAGES, "render"):
        if name in frame_stages:
            value = float(frame_stages[name])
            stages.setdefault(name, []).append(value)
            inside += value if name in PATH_STAGES else 0.0  # render runs inside the budget
    stages.setdefault("outside", []).append(latency_ms - inside)


def _meta_onset(recording: CallRecording, burst: analysis.Burst, meta: dict[int, MetaMessage]) -> int | None:
    """The first frame whose metadata shows an open mouth with audio from around the burst's start, and
    whose render was ready (a late frame repeats the picture before it: on a busy machine the first frames
    of a burst often are)."""
    for number in sorted(meta):
        m = meta[number]
        audio_ms = m.get("audio_ms")
        if audio_ms is None:
            continue
        position = round(audio_ms * 48) - OPUS_DELAY_SAMPLES
        if position + MEDIA_SAMPLES_PER_FRAME < burst.start - MEDIA_SAMPLE_RATE_HZ // 10:
            continue
        if position > burst.end:
            return None
        if m.get("active") and not m.get("late"):
            return number
    return None
