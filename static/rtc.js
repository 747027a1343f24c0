// Small browser-media helpers: ICE gathering, codec order, jitter buffer, mic level.

/** Resolves when ICE gathering is complete, or after `timeoutMs` with what was gathered. */
export function iceGatheringDone(pc, timeoutMs) {
  if (pc.iceGatheringState === 'complete') return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener('icegatheringstatechange', check);
      resolve();
    };
    const check = () => pc.iceGatheringState === 'complete' && done();
    // An unreachable STUN/TURN server can hold gathering open for a long time; after the
    // timeout the offer goes out with the candidates we have (host ones come first).
    const timer = setTimeout(done, timeoutMs);
    pc.addEventListener('icegatheringstatechange', check);
  });
}

/** Put `mimeType` first and keep the others as fallbacks, so negotiation still succeeds. */
export function preferCodec(transceiver, mimeType, only = false) {
  const caps = globalThis.RTCRtpReceiver?.getCapabilities?.('video');
  if (!caps || typeof transceiver.setCodecPreferences !== 'function') return;
  const wanted = (c) => c.mimeType.toLowerCase() === mimeType.toLowerCase();
  if (!caps.codecs.some(wanted)) return;
  // `only`: offer just this codec (and the retransmission/FEC helpers), so the server cannot pick another.
  const helper = (c) => /\/(rtx|red|ulpfec|flexfec-03)$/i.test(c.mimeType);
  const rest = caps.codecs.filter((c) => !wanted(c) && (!only || helper(c)));
  try {
    transceiver.setCodecPreferences([...caps.codecs.filter(wanted), ...rest]);
  } catch (err) {
    console.warn('setCodecPreferences failed; keeping the browser default order', err);
  }
}

/** Ask for the smallest playout delay the network allows (the browser still adapts to jitter). */
export function lowLatency(receiver) {
  try {
    if ('jitterBufferTarget' in receiver) receiver.jitterBufferTarget = 0; // ms; Chrome 124+, Firefox
    else if ('playoutDelayHint' in receiver) receiver.playoutDelayHint = 0; // s; older Chrome
  } catch (err) {
    console.warn('could not lower the jitter buffer target', err);
  }
}

const METER_FLOOR_DB = -60; // the meter spans -60 dBFS (0) .. 0 dBFS (1)

/**
 * Level meter on a LOCAL stream: calls onLevel(0..1) every animation frame.
 * Returns {level(), close()}; null where WebAudio is missing.
 */
export function levelMeter(stream, onLevel) {
  const Ctx = globalThis.AudioContext ?? globalThis.webkitAudioContext;
  if (!Ctx) return null;
  const ctx = new Ctx();
  ctx.resume().catch(() => {}); // suspended without a user gesture (autostart); harmless if refused
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 1024;
  // Source -> analyser only, not to the speakers: the mic is measured, never played back.
  ctx.createMediaStreamSource(stream).connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  let level = 0;
  let raf = 0;
  const tick = () => {
    analyser.getFloatTimeDomainData(samples);
    let sum = 0;
    for (const v of samples) sum += v * v;
    const db = 20 * Math.log10(Math.sqrt(sum / samples.length) || 1e-9);
    const now = Math.min(1, Math.max(0, 1 - db / METER_FLOOR_DB));
    level = Math.max(now, level * 0.85); // fast attack, slow release: easier to read
    onLevel(level);
    raf = requestAnimationFrame(tick);
  };
  tick();
  return {
    level: () => level,
    close() {
      cancelAnimationFrame(raf);
      ctx.close().catch(() => {});
    },
  };
}
