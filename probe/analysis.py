"""Black-box measurements on a recorded call: frame rate, audio alignment and loss, mouth motion, latency.

Everything here works from what a client can see: the audio it sent (and when each packet left), the video
and audio it received (and when each frame arrived), and the mouth region the server advertised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ, OPUS_PACKET_SAMPLES
from lipcast.probe.client import CallRecording
from lipcast.probe.media import ReceivedAudio

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


# A block may match up to 4 ms before its place (a fading or split block).
EARLY_MATCH = MEDIA_SAMPLE_RATE_HZ // 250


def found_blocks(
    sent: npt.NDArray[np.int16],
    received: npt.NDArray[np.int16],
    lag: int,
    *,
    block: int = OPUS_PACKET_SAMPLES,
    search: int = 4 * OPUS_PACKET_SAMPLES,
    max_inserted: int = 2 * MEDIA_SAMPLE_RATE_HZ,
    min_rms: float = 300.0,
    min_correlation: float = 0.95,
) -> list[tuple[int, int | None]]:
    """Follow the sent audio through the received audio from ``lag`` (received index - sent index), block
    by block: for every sent block with sound, (its start, its lag where it was found, or None).

    Blocks are compared by their magnitude spectra up to 10 kHz (Opus keeps the spectrum, not the waveform:
    two codec hops leave a waveform correlation of only ~0.85, while the spectra of the same block correlate
    above 0.99 and those of other speech below 0.9). Each block is looked for in 2 ms steps from its
    expected place (where the block before it ended) up to ``search`` samples later, so a late but complete
    block still counts.

    The lag only grows inside a stretch of sound: a jitter buffer that runs dry plays silence and then the
    late audio, in order. A longer dry spell (a stalled machine) leaves silence where the next block was
    expected; the search then goes on after that silence (up to ``max_inserted`` samples of it), and a block
    that the silence began inside of counts as found (split, not lost). Audio that was dropped leaves the
    following audio *earlier* than expected and audio replaced by other sound is not silence, so both still
    count as lost; a block that only matches earlier than its place is a different block of the same vowel.
    """
    window = np.hanning(block)
    bins = block * 10_000 // MEDIA_SAMPLE_RATE_HZ
    step = MEDIA_SAMPLE_RATE_HZ // 500

    def spectrum(x: npt.NDArray[np.int16]) -> FloatArray:
        return np.abs(np.fft.rfft(x.astype(np.float64) * window))[:bins]

    def silent(at: int) -> bool:
        y = received[at : at + block].astype(np.float64)
        return len(y) == block and float(np.sqrt(np.mean(y * y))) < min_rms

    def near(start: int, target: FloatArray, lag: int) -> int | None:
        for shift in sorted(range(-EARLY_MATCH, search + 1, step), key=abs):
            at = start + lag + shift
            if at < 0 or at + block > len(received) or silent(at):
                continue
            if np.corrcoef(target, spectrum(received[at : at + block]))[0, 1] >= min_correlation:
                return lag + shift
        return None

    def inserted_silence(at: int) -> tuple[int, int] | None:
        """A stretch of silence (30 ms or more) that begins within the block at ``at``: (where it begins,
        how long it is, in whole-block windows' starts)."""
        for begin in range(max(0, at), at + block, step):
            if silent(begin):
                end = begin
                while silent(end) and end - begin <= max_inserted:
                    end += step
                if end - begin >= block // 2 and not silent(end):
                    return begin, end - begin
                return None
        return None

    out: list[tuple[int, int | None]] = []
    for start in range(0, len(sent) - block + 1, block):
        samples = sent[start : start + block].astype(np.float64)
        if np.sqrt(np.mean(samples * samples)) < min_rms:
            continue
        target = spectrum(sent[start : start + block])
        hit = near(start, target, lag)
        gap = inserted_silence(start + lag) if hit is None else None
        if gap is not None:
            begin, length = gap
            if begin - (start + lag) >= block // 4:
                out.append((start, lag))  # split: its first part before the silence, the rest after it
                lag += length
                continue
            hit = near(start, target, lag + length)
        if hit is not None:
            lag = hit
        out.append((start, hit))
    return out


def burst_lags(
    sent: npt.NDArray[np.int16],
    received: npt.NDArray[np.int16],
    bursts: list[Burst],
    around: int,
    *,
    search: int = MEDIA_SAMPLE_RATE_HZ,
    onset: int = MEDIA_SAMPLE_RATE_HZ // 25,
    min_correlation: float = 0.7,
) -> list[tuple[int, float]]:
    """Where each burst begins in the received audio, as a lag (received index - sent index), with the
    normalised correlation there.

    A burst's first ``onset`` samples are looked for within ``search`` of ``around`` (the whole call's lag)
    and after the previous burst's end: the *earliest* place where they correlate ``min_correlation`` or
    better (then the best place within ``onset`` after it). Not simply the best place: speech repeats its
    syllables, so later parts of the same burst may match as well, and the audio may have been split by a
    dry jitter buffer after its first part. The server's jitter buffer may remove silence (to bring latency
    back down) or play silence while it is dry, so the lag differs from burst to burst and may grow inside
    one; a burst's onset is its own.
    """
    out: list[tuple[int, float]] = []
    earliest = 0
    for burst in bursts:
        piece = sent[burst.start : min(burst.end, burst.start + onset)].astype(np.float64)
        lo = max(earliest, burst.start + around - search)
        hi = min(len(received), burst.start + around + search + len(piece))
        if hi - lo < len(piece) or not piece.any():
            out.append((around, 0.0))
            continue
        scores = match_scores(piece, received[lo:hi].astype(np.float64))
        good = np.flatnonzero(scores >= min_correlation)
        first = int(good[0]) if len(good) else int(np.argmax(scores))
        at = first + int(np.argmax(scores[first : first + len(piece)]))
        out.append((lo + at - burst.start, float(scores[at])))
        earliest = lo + at + (burst.end - burst.start)
    return out


def match_scores(piece: FloatArray, within: FloatArray) -> FloatArray:
    """Normalised cross-correlation of ``piece`` with each window of ``within`` (0 for windows holding less
    than 1/400 of the piece's energy: exact zeros from a dry jitter buffer would divide rounding noise by 0).
    """
    n = 1 << int(np.ceil(np.log2(len(piece) + len(within))))
    corr = np.fft.irfft(np.fft.rfft(within, n) * np.conj(np.fft.rfft(piece, n)), n)
    positions = len(within) - len(piece) + 1
    energy = np.concatenate([[0.0], np.cumsum(within * within)])
    norms = np.sqrt(np.maximum(energy[len(piece) : len(piece) + positions] - energy[:positions], 0.0))
    reference = np.sqrt(np.sum(piece * piece))
    audible = norms > 0.05 * reference
    scores: FloatArray = np.where(audible, corr[:positions] / (reference * np.maximum(norms, 1e-9)), 0.0)
    return scores


def returned_by_burst(
    sent: npt.NDArray[np.int16],
    received: npt.NDArray[np.int16],
    bursts: list[Burst],
    lags: list[int],
) -> tuple[float, int, int, list[int | None]]:
    """The sent blocks with sound found again, each burst followed from its own lag (:func:`found_blocks`):
    (fraction found, blocks checked, blocks out of order, each burst's lag at its first block found). A
    block is out of order when it comes back before the end of the one found before it (by more than the
    4 ms that a block's match may sit early: the fading last block of a burst)."""
    found = checked = reordered = 0
    previous_end: int | None = None
    first_lags: list[int | None] = []
    for burst, lag in zip(bursts, lags, strict=True):
        only = np.zeros_like(sent)
        only[burst.start : burst.end] = sent[burst.start : burst.end]
        blocks = found_blocks(only, received, lag)
        checked += len(blocks)
        hits = [(start, hit) for start, hit in blocks if hit is not None]
        found += len(hits)
        first_lags.append(hits[0][1] if hits else None)
        for start, hit in hits:
            if previous_end is not None and start + hit < previous_end - EARLY_MATCH:
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


def audio_delays_ms(
    recording: CallRecording, lag: int, bursts: list[Burst] | None = None, lags: list[int] | None = None
) -> tuple[FloatArray, FloatArray]:
    """Input -> output audio delay for every received chunk that carries sent audio: (arrival times (s,
    monotonic), delays (ms)).

    With ``bursts`` and their own ``lags`` (:func:`burst_lags`), only the chunks inside a burst count, each
    at its burst's lag: a buffer that deepened or trimmed mid-call moved the later bursts, and one lag for
    the whole call would map their audio to the wrong sent samples (and hide the change)."""
    spans = None
    if bursts is not None and lags is not None:
        spans = np.asarray([(b.start + g, b.end + g, g) for b, g in zip(bursts, lags, strict=True)], np.int64)
        spans = spans.reshape(-1, 3)
    times, delays = [], []
    for start, arrived in zip(recording.audio.starts, recording.audio.arrived_at, strict=True):
        chunk_lag = lag
        if spans is not None:
            inside = np.flatnonzero((spans[:, 0] <= start) & (start < spans[:, 1]))
            if not len(inside):
                continue
            chunk_lag = int(spans[inside[-1], 2])
        sent_at = sent_time(recording, start - chunk_lag)
        if sent_at is not None:
            times.append(arrived)
            delays.append((arrived - sent_at) * 1000.0)
    return np.asarray(times, dtype=np.float64), np.asarray(delays, dtype=np.float64)


@dataclass(frozen=True)
class DelayRecovery:
    """The audio delay before, during and after an impaired stretch of a call."""

    before_ms: float  # median before the stretch (the call's clean delay)
    during_ms: float  # median during it
    after_ms: float  # median of the last seconds of the call
    recovered_s: float | None  # from the stretch's end until the delay stayed within tolerance (None: never)


def delay_recovery(
    times: FloatArray,
    delays_ms: FloatArray,
    impaired_from: float,
    impaired_until: float,
    tolerance_ms: float = 20.0,
    bin_s: float = 1.0,
    settle_s: float = 2.0,
    hold_s: float = 5.0,
) -> DelayRecovery | None:
    """How long after ``impaired_until`` the delay came back within ``tolerance_ms`` of its clean value.

    The clean value is the median delay from ``settle_s`` after the first chunk to ``impaired_from``; after
    the stretch the delay is taken per ``bin_s`` (its median), and the call has recovered at the start of the
    first bin from which ``hold_s`` of bins are all within tolerance (a later, unrelated stall does not undo
    it). None when there is no clean stretch to compare.
    """
    if not len(times):
        return None
    clean = (times >= times[0] + settle_s) & (times < impaired_from)
    during = (times >= impaired_from) & (times < impaired_until)
    after = times >= impaired_until
    if clean.sum() < 10 or not after.any():
        return None
    before = float(np.median(delays_ms[clean]))
    bins = np.floor((times[after] - impaired_until) / bin_s).astype(int)
    later = delays_ms[after]
    within = {int(b): abs(float(np.median(later[bins == b])) - before) <= tolerance_ms for b in set(bins)}
    held = max(1, round(hold_s / bin_s))
    recovered: float | None = None
    for first in sorted(within):
        run = [within.get(first + k) for k in range(held)]
        if all(ok is not None and ok for ok in run):
            recovered = float(first * bin_s)
            break
    tail = after & (times >= times[-1] - 5.0)
    return DelayRecovery(
        before_ms=round(before, 1),
        during_ms=round(float(np.median(delays_ms[during])), 1) if during.any() else float("nan"),
        after_ms=round(float(np.median(delays_ms[tail])), 1),
        recovered_s=recovered,
    )


def mouth_motion(recording: CallRecording, reference_frames: int = 10) -> FloatArray:
    """Mean absolute difference of each frame's mouth region from the resting mouth (the first frames)."""
    regions = np.stack(recording.video.regions).astype(np.float64)
    reference = np.median(regions[:reference_frames], axis=0)
    return np.abs(regions - reference).mean(axis=(1, 2, 3))


def mouth_speech_correlation(
    sent: npt.NDArray[np.int16],
    sent_at: list[float],
    frame_arrivals: FloatArray,
    motion: FloatArray,
    delay_ms: float,
    search_ms: float = 120.0,
    step_ms: float = 10.0,
) -> tuple[float, float]:
    """How well the mouth follows the speech the client sent: (correlation, the delay that gives it, ms).

    Per received frame, the loudness (RMS) of the 40 ms of sent audio that ended ``d`` before the frame
    arrived, correlated with the frame's mouth motion; ``d`` is searched within ``search_ms`` of ``delay_ms``
    (the call's audio delay) and the best kept. One fixed delay for the whole call: a call whose delay jumps
    (a stall, a buffer that grew) has frames whose mouth belongs to other audio, and scores lower.
    """
    packets = len(sent_at)
    if packets < 2 or len(frame_arrivals) < 3:
        return 0.0, delay_ms
    usable = min(packets, len(sent) // OPUS_PACKET_SAMPLES)
    blocks = sent[: usable * OPUS_PACKET_SAMPLES].astype(np.float64).reshape(usable, OPUS_PACKET_SAMPLES)
    loudness = np.sqrt((blocks**2).mean(axis=1))
    send_times = np.asarray(sent_at[:usable])
    arrivals = np.asarray(frame_arrivals, dtype=np.float64)
    best = (-1.0, delay_ms)
    for d_ms in np.arange(delay_ms - search_ms, delay_ms + search_ms + step_ms / 2, step_ms):
        # The two 20 ms packets that had left by (arrival - d): the frame's 40 ms of speech.
        last = np.searchsorted(send_times, arrivals - d_ms / 1000.0, side="right") - 1
        valid = last >= 1
        if valid.sum() < 3:
            continue
        envelope = (loudness[last[valid]] + loudness[last[valid] - 1]) / 2.0
        moved = motion[: len(arrivals)][valid]
        if envelope.std() == 0 or moved.std() == 0:
            continue
        score = float(np.corrcoef(envelope, moved)[0, 1])
        if score > best[0]:
            best = (score, float(d_ms))
    return (best[0] if best[0] > -1.0 else 0.0), best[1]


ONSET_START_FRACTION = 0.5  # the rise to the threshold starts where motion is above this share of it


def onset_latencies_ms(
    recording: CallRecording, bursts: list[Burst], motion: FloatArray, threshold: float
) -> list[float | None]:
    """For each burst: time from its first sample leaving the client to the mouth starting to move.

    The mouth moves once its motion is over ``threshold``; its movement started at the beginning of that rise:
    from the first frame over the threshold, back over the frames right before it whose motion is above
    ``ONSET_START_FRACTION`` of the threshold. (A mouth opening over a 3-frame crossfade crosses a threshold
    set by the call's codec noise in its second or third frame; the start of its rise is its first or second.)
    """
    arrived = np.asarray(recording.video.arrived_at)
    out: list[float | None] = []
    for burst in bursts:
        t_on = sent_time(recording, burst.start)
        if t_on is None:
            out.append(None)
            continue
        after = arrived > t_on
        moving = np.nonzero(after & (motion > threshold))[0]
        if not len(moving):
            out.append(None)
            continue
        first = int(moving[0])
        while first > 0 and after[first - 1] and motion[first - 1] > ONSET_START_FRACTION * threshold:
            first -= 1
        out.append(float((arrived[first] - t_on) * 1000.0))
    return out


def picture_recoveries_ms(
    arrivals: list[float], keyframes_at: list[float], breaks: list[float]
) -> list[float]:
    """For each time the picture broke (the receiver gave up on a missing packet and asked for a keyframe,
    or a keyframe was lost): how long it stayed broken, from the last frame that arrived before it to the
    next keyframe's release (a break before the first frame, or one inside a breakage already counted, adds
    none; one never mended counts to the last frame)."""
    out: list[float] = []
    mended_at = float("-inf")
    for broke in sorted(breaks):
        if broke < mended_at:
            continue
        before = [a for a in arrivals if a <= broke]
        if not before:
            continue
        after = [k for k in keyframes_at if k > broke]
        mended_at = after[0] if after else arrivals[-1]
        out.append(round((mended_at - before[-1]) * 1000.0, 1))
    return out
