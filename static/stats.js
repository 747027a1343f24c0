// Pure helpers that turn an RTCStatsReport (plus the previous summary) into one flat
// object and a one-line text. No DOM, no globals: usable from tests in node.

const finite = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);

/**
 * Summarise one getStats() report.
 * `prev` is the previous return value (or null); rates are computed over the interval
 * between the two reports, so they show the last second rather than the call's average.
 * Every field is a number or null (missing in this browser / not yet known).
 */
export function summarizeStats(report, prev = null) {
  let video = null;
  let audioIn = null;
  let audioOut = null;
  let selectedPairId = null;
  const pairs = new Map();

  report.forEach((s) => {
    const kind = s.kind ?? s.mediaType; // mediaType: older Chrome
    if (s.type === 'inbound-rtp' && kind === 'video') video = s;
    else if (s.type === 'inbound-rtp' && kind === 'audio') audioIn = s;
    else if (s.type === 'outbound-rtp' && kind === 'audio') audioOut = s;
    else if (s.type === 'transport' && s.selectedCandidatePairId) selectedPairId = s.selectedCandidatePairId;
    else if (s.type === 'candidate-pair') pairs.set(s.id, s);
  });

  // The pair in use: the transport names it (spec, Chrome); Firefox flags it `selected`;
  // otherwise the nominated pair that succeeded.
  let pair = selectedPairId ? pairs.get(selectedPairId) : undefined;
  if (!pair) pair = [...pairs.values()].find((p) => p.selected);
  if (!pair) pair = [...pairs.values()].find((p) => p.nominated && p.state === 'succeeded');

  const timestamp = finite(video?.timestamp) ?? finite(audioIn?.timestamp) ?? Date.now();
  const out = {
    timestamp,
    framesDecoded: finite(video?.framesDecoded),
    framesReceived: finite(video?.framesReceived),
    framesDropped: finite(video?.framesDropped),
    frameWidth: finite(video?.frameWidth),
    frameHeight: finite(video?.frameHeight),
    codec: (video?.codecId && report.get?.(video.codecId)?.mimeType) || null,
    fps: null,
    videoPacketsLost: finite(video?.packetsLost),
    // Cumulative jitter-buffer totals, kept so the next summary can take deltas.
    jitterBufferDelayS: finite(video?.jitterBufferDelay),
    jitterBufferEmittedCount: finite(video?.jitterBufferEmittedCount),
    jitterBufferMs: null,
    audioPacketsReceived: finite(audioIn?.packetsReceived),
    audioPacketsLost: finite(audioIn?.packetsLost),
    audioJitterBufferDelayS: finite(audioIn?.jitterBufferDelay),
    audioJitterBufferEmittedCount: finite(audioIn?.jitterBufferEmittedCount),
    audioJitterBufferMs: null,
    audioPacketsSent: finite(audioOut?.packetsSent),
    rttMs: pair && finite(pair.currentRoundTripTime) !== null ? pair.currentRoundTripTime * 1000 : null,
  };

  // fps: frames decoded over the interval; the browser's own framesPerSecond before that.
  const dtS = prev ? (timestamp - prev.timestamp) / 1000 : 0;
  if (dtS > 0 && out.framesDecoded !== null && prev.framesDecoded !== null) {
    out.fps = (out.framesDecoded - prev.framesDecoded) / dtS;
  } else {
    out.fps = finite(video?.framesPerSecond);
  }

  // jitterBufferDelay is the summed seconds each frame/sample spent in the jitter buffer;
  // divided by the count emitted it is the mean delay per frame. Over the last interval when
  // possible (current behaviour), else since the call began.
  out.jitterBufferMs = perItemMs(out.jitterBufferDelayS, out.jitterBufferEmittedCount,
    prev?.jitterBufferDelayS, prev?.jitterBufferEmittedCount);
  out.audioJitterBufferMs = perItemMs(out.audioJitterBufferDelayS, out.audioJitterBufferEmittedCount,
    prev?.audioJitterBufferDelayS, prev?.audioJitterBufferEmittedCount);
  return out;
}

function perItemMs(delayS, count, prevDelayS, prevCount) {
  if (delayS === null || count === null) return null;
  if (finite(prevDelayS) !== null && finite(prevCount) !== null && count > prevCount) {
    return ((delayS - prevDelayS) / (count - prevCount)) * 1000;
  }
  return count > 0 ? (delayS / count) * 1000 : null;
}

const num = (v, digits = 0) => (v === null || v === undefined ? '–' : v.toFixed(digits));
const short = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));

/**
 * Server metadata from the "meta" data channel, e.g.
 * {frame, avatar_frame, audio_ms, speech, late, stages_ms: {features, render}}.
 * Shows the frame number, other numeric fields, flags that are true, and the numbers one
 * level inside objects (stages); anything else is ignored, so the server may add fields freely.
 */
export function formatMeta(meta, maxFields = 8) {
  if (!meta || typeof meta !== 'object') return '';
  const parts = [];
  if (finite(meta.frame) !== null) parts.push(`frame ${meta.frame}`);
  const nested = [];
  for (const [key, value] of Object.entries(meta)) {
    if (key === 'frame') continue;
    if (finite(value) !== null) parts.push(`${key} ${short(value)}`);
    else if (value === true) parts.push(key);
    else if (value && typeof value === 'object' && !Array.isArray(value)) nested.push([key, value]);
  }
  for (const [group, values] of nested) {
    const unit = group.endsWith('_ms') ? ' ms' : '';
    for (const [key, value] of Object.entries(values)) {
      if (finite(value) !== null) parts.push(`${key} ${short(value)}${unit}`);
    }
  }
  return parts.slice(0, maxFields).join(' · ');
}

/** One line for the page: video rate and losses, network, then the server's metadata. */
export function formatStats(s) {
  const line = [
    `${num(s.fps, 1)} fps`,
    `${num(s.framesDecoded)} decoded`,
    `${num(s.framesDropped)} dropped`,
    `RTT ${num(s.rttMs)} ms`,
    `jitter buffer ${num(s.jitterBufferMs)} ms/frame`,
    `audio lost ${num(s.audioPacketsLost)}`,
  ].join(' · ');
  const meta = formatMeta(s.meta);
  return meta ? `${line} | server: ${meta}` : line;
}
