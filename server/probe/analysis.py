"""Black-box measurements on a recorded call: frame rate, audio alignment and loss, mouth motion, latency.

Everything here works from what a client can see: the audio it sent (and when each packet left), the video
and audio it received (and when each frame arrived), and the mouth region the server advertised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.timing import MEDIA_SAMPLE_RATE_HZ, OPUS_PACKET_SAMPLES
from server.probe.client import CallRecording
from server.probe.media import ReceivedAudio

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Burst:
    """A stretch of sound in the sent audio, in samples at 48 kHz: ``[start, end)``."""

    start: int
    end: int


def detect_bursts(
    audio: npt.NDArray[np.int16], *, threshold_dbfs: float = -40.0, min_gap_ms: float = 150.0
) -> list[Burst]:
    """Bursts of sound separated by ``min_gap_ms`` or more below ``threshold_dbfs`` (10 ms frames)."""
    frame = MEDIA_SAMPLE_RATE_HZ // 100
    count = len(audio) // frame
    x = audio[: count * frame].astype(np.float64).reshape(count, frame) / 32768.0
    level_db = 10 * np.log10(np.mean(x * x, axis=1) + 1e-12)
    loud = level_db > threshold_dbfs
    bursts: list[Burst] = []
    gap_frames = int(min_gap_ms / 10)
    i = 0
    while i < count:
        if not loud[i]:
            i += 1
            continue
        start = i
        quiet = 0
        while i < count and quiet < gap_frames:
            quiet = 0 if loud[i] else quiet + 1
            i += 1
        bursts.append(Burst(start * frame, (i - quiet) * frame))
    return bursts


def received_fps(arrived_at: list[float], skip_s: float = 1.0) -> float:
    """Frames per second over the recording, ignoring the first ``skip_s`` (connection start-up)."""
    times = np.asarray(arrived_at)
    if len(times) < 2:
        return 0.0
    times = times[times >= times[0] + skip_s]
    if len(times) < 2:
        return 0.0
    return float((len(times) - 1) / (times[-1] - times[0]))


def frame_gaps_ms(arrived_at: list[float]) -> FloatArray:
    return np.diff(np.asarray(arrived_at)) * 1000.0


def align(sent: npt.NDArray[np.int16], received: npt.NDArray[np.int16]) -> tuple[int, float]:
    """The lag (received index - sent index) that best lines the two up, and its normalised correlation."""
    a = sent.astype(np.float64)
    b = received.astype(np.float64)
    n = 1 << int(np.ceil(np.log2(len(a) + len(b))))
    corr = np.fft.irfft(np.fft.rfft(b, n) * np.conj(np.fft.rfft(a, n)), n)
    lags = np.concatenate([np.arange(0, len(b)), np.arange(-len(a) + 1, 0)])
    values = np.concatenate([corr[: len(b)], corr[n - len(a) + 1 :]])
    best = int(np.argmax(values))
    lag = int(lags[best])
    lo, hi = max(0, -lag), min(len(a), len(b) - lag)
    if hi - lo <= 0:
        return lag, 0.0
    seg_a, seg_b = a[lo:hi], b[lo + lag : hi + lag]
    denom = np.sqrt(np.sum(seg_a * seg_a) * np.sum(seg_b * seg_b)) + 1e-12
    return lag, float(np.sum(seg_a * seg_b) / denom)


def found_blocks(
    sent: npt.NDArray[np.int16],
    received: npt.NDArray[np.int16],
    lag: int,
    *,
    follow: bool = False,
    block: int = OPUS_PACKET_SAMPLES,
    search: int = 4 * OPUS_PACKET_SAMPLES,
    min_rms: float = 300.0,
    min_correlation: float = 0.95,
) -> list[tuple[int, int | None]]:
    """For every sent block with sound: (its start, its lag in the received audio, or None if not found).

    Blocks are compared by their magnitude spectra up to 10 kHz (Opus keeps the spectrum, not the waveform:
    two codec hops leave a waveform correlation of only ~0.85, while the spectra of the same block correlate
    above 0.99 and those of other speech below 0.9). Each block is looked for in 2 ms steps within ``search``
    samples of its expected place, so a late but complete block still counts. With ``follow`` the expected
    place moves with each block found: a jitter buffer that ran dry plays silence and then the late audio,
    so the lag may step by a packet or two anywhere in the stream, also inside a burst.
    """
    window = np.hanning(block)
    bins = block * 10_000 // MEDIA_SAMPLE_RATE_HZ

    def spectrum(x: npt.NDArray[np.int16]) -> FloatArray:
        return np.abs(np.fft.rfft(x.astype(np.float64) * window))[:bins]

    step = MEDIA_SAMPLE_RATE_HZ // 500
    out: list[tuple[int, int | None]] = []
    for start in range(0, len(sent) - block + 1, block):
        ref = sent[start : start + block].astype(np.float64)
        if np.sqrt(np.mean(ref * ref)) < min_rms:
            continue
        target = spectrum(sent[start : start + block])
        hit: int | None = None
        for shift in sorted(range(-search, search + 1, step), key=abs):
            at = start + lag + shift
            if at < 0 or at + block > len(received):
                continue
            candidate = spectrum(received[at : at + block])
            if np.corrcoef(target, candidate)[0, 1] >= min_correlation:
                hit = lag + shift
                break
        if hit is not None and follow:
            lag = hit
        out.append((start, hit))
    return out


def returned_fraction(
    sent: npt.NDArray[np.int16], received: npt.NDArray[np.int16], lag: int
) -> tuple[float, int]:
    """Share of the sent audio (blocks with sound) found again near ``lag`` (:func:`found_blocks`), and how
    many blocks were checked."""
    blocks = found_blocks(sent, received, lag)
    found = sum(1 for _, hit in blocks if hit is not None)
    return (found / len(blocks) if blocks else 0.0), len(blocks)


def burst_lags(
    sent: npt.NDArray[np.int16],
    received: npt.NDArray[np.int16],
    bursts: list[Burst],
    around: int,
    *,
    search: int = MEDIA_SAMPLE_RATE_HZ // 2,
) -> list[tuple[int, float]]:
    """Each burst's own lag (received index - sent index) and correlation, looked for within ``search``
    samples of ``around`` (the whole call's lag).

    The server's jitter buffer may remove silence (to bring latency back down) or play silence while it is
    dry, so the lag may differ from burst to burst (and step by a packet or two inside one after a dry tick).
    """
    out = []
    for burst in bursts:
        lo = max(0, burst.start + around - search)
        hi = min(len(received), burst.end + around + search)
        if hi - lo < burst.end - burst.start:
            out.append((around, 0.0))
            continue
        local, correlation = align(sent[burst.start : burst.end], received[lo:hi])
        out.append((lo + local - burst.start, correlation))
    return out


def returned_by_burst(
    sent: npt.NDArray[np.int16],
    received: npt.NDArray[np.int16],
    bursts: list[Burst],
    lags: list[int],
) -> tuple[float, int, int, list[int | None]]:
    """The sent blocks with sound found again, each burst followed from its own lag (:func:`found_blocks`
    with ``follow``): (fraction found, blocks checked, blocks out of order, each burst's lag at its first
    block found). A block is out of order when it comes back before the end of the one found before it."""
    found = checked = reordered = 0
    previous_end: int | None = None
    first_lags: list[int | None] = []
    for burst, lag in zip(bursts, lags, strict=True):
        only = np.zeros_like(sent)
        only[burst.start : burst.end] = sent[burst.start : burst.end]
        blocks = found_blocks(only, received, lag, follow=True)
        checked += len(blocks)
        hits = [(start, hit) for start, hit in blocks if hit is not None]
        found += len(hits)
        first_lags.append(hits[0][1] if hits else None)
        for start, hit in hits:
            if previous_end is not None and start + hit < previous_end:
                reordered += 1
            previous_end = start + hit + OPUS_PACKET_SAMPLES
    return (found / checked if checked else 0.0), checked, reordered, first_lags


def sent_time(recording: CallRecording, sample: int) -> float | None:
    """When the client handed sample ``sample`` of its audio to the network (monotonic seconds)."""
    packet = sample // OPUS_PACKET_SAMPLES
    if not 0 <= packet < len(recording.source.sent_at):
        return None
    return recording.source.sent_at[packet] + (sample % OPUS_PACKET_SAMPLES) / MEDIA_SAMPLE_RATE_HZ


def received_time(recording: CallRecording, sample: int) -> float | None:
    """When received-audio sample ``sample`` arrived (its decoded chunk's arrival)."""
    return received_time_of(recording.audio, sample)


def received_time_of(audio: ReceivedAudio, sample: int) -> float | None:
    """When sample ``sample`` of ``audio`` arrived (its decoded chunk's arrival)."""
    i = int(np.searchsorted(audio.starts, sample, side="right")) - 1
    if i < 0 or sample >= audio.total:
        return None
    return audio.arrived_at[i]


def audio_delays_ms(recording: CallRecording, lag: int) -> FloatArray:
    """Input -> output audio delay for every received chunk that carries sent audio."""
    delays = []
    for start, arrived in zip(recording.audio.starts, recording.audio.arrived_at, strict=True):
        sent_at = sent_time(recording, start - lag)
        if sent_at is not None:
            delays.append((arrived - sent_at) * 1000.0)
    return np.asarray(delays)


def mouth_motion(recording: CallRecording, reference_frames: int = 10) -> FloatArray:
    """Mean absolute difference of each frame's mouth region from the resting mouth (the first frames)."""
    regions = np.stack(recording.video.regions).astype(np.float64)
    reference = np.median(regions[:reference_frames], axis=0)
    return np.abs(regions - reference).mean(axis=(1, 2, 3))


def onset_latencies_ms(
    recording: CallRecording, bursts: list[Burst], motion: FloatArray, threshold: float
) -> list[float | None]:
    """For each burst: time from its first sample leaving the client to the first moving mouth arriving."""
    arrived = np.asarray(recording.video.arrived_at)
    out: list[float | None] = []
    for burst in bursts:
        t_on = sent_time(recording, burst.start)
        if t_on is None:
            out.append(None)
            continue
        moving = np.nonzero((arrived > t_on) & (motion > threshold))[0]
        out.append(float((arrived[moving[0]] - t_on) * 1000.0) if len(moving) else None)
    return out
