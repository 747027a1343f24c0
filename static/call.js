// lipcast call page: the microphone goes to the server over WebRTC; the avatar's
// lip-synced video comes back together with the voice, on one <video> element.
import { API, UserError, deleteSession, getJson, postOffer } from './api.js';
import { iceGatheringDone, levelMeter, lowLatency, preferCodec } from './rtc.js';
import { formatStats, summarizeStats } from './stats.js';

const params = new URLSearchParams(location.search);
const ICE_GATHER_TIMEOUT_MS = 5000;
const STATS_INTERVAL_MS = 1000;

// Mic processing on by default; ?ec=0&ns=0&agc=0 turns it off (e.g. a test feeding a WAV file).
const isOff = (name) => ['0', 'false', 'off', 'no'].includes((params.get(name) ?? '').toLowerCase());
const MIC_CONSTRAINTS = {
  echoCancellation: !isOff('ec'),
  noiseSuppression: !isOff('ns'),
  autoGainControl: !isOff('agc'),
};

const $ = (id) => document.getElementById(id);
const ui = {
  start: $('start'), stop: $('stop'), picker: $('avatar-select'), pickerField: $('avatar-field'),
  size: $('size-select'), codec: $('codec-select'),
  video: $('avatar-video'), unmute: $('unmute'), conn: $('conn'), level: $('mic-level'),
  stats: $('stats'), error: $('error'),
  enhance: $('enhance-select'), strength: $('enhance-strength'),
  watch: $('watch'), watchLink: $('watch-link'), whepUrl: $('whep-url'),
};

let state = 'idle'; // idle | connecting | connected | failed | closed
let call = null; // everything the current call owns; null between calls
let latestStats = null;
let iceServers = [];
let avatars = []; // from GET /avatars; empty when the server has no picker

function setState(next) {
  state = next;
  document.body.dataset.state = next;
  const busy = next === 'connecting' || next === 'connected';
  ui.start.disabled = busy;
  ui.stop.disabled = !busy;
  ui.picker.disabled = busy;
  ui.enhance.disabled = busy;
  ui.strength.disabled = busy;
}

// Face post-processing (docs/sharpen.md): ?face_enhance=sharpen&face_enhance_strength=0.5 preselect it.
if (['off', 'sharpen'].includes(params.get('face_enhance'))) ui.enhance.value = params.get('face_enhance');
if (params.get('face_enhance_strength')) ui.strength.value = params.get('face_enhance_strength');
const strengthShown = () => { ui.strength.hidden = ui.enhance.value !== 'sharpen'; };
ui.enhance.addEventListener('change', strengthShown);
strengthShown();

/** The offer's face_enhance fields: none for the server's default. */
function enhanceOptions() {
  if (!ui.enhance.value) return {};
  const options = { face_enhance: ui.enhance.value };
  if (ui.enhance.value === 'sharpen') options.face_enhance_strength = Number(ui.strength.value);
  return options;
}

function setConn(text, level) {
  ui.conn.textContent = text;
  ui.conn.dataset.level = level; // ok | busy | warn | bad | off (colours in style.css)
}

function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = !message;
}

// ---- start-up: ICE servers and avatar list (both optional on the server) ----

function fillPicker(data) {
  avatars = Array.isArray(data?.avatars) ? data.avatars.filter((a) => a && a.name) : [];
  if (!avatars.length) return; // no /avatars: keep the picker hidden, the server picks the default
  const wanted = params.get('avatar');
  if (wanted && !avatars.some((a) => a.name === wanted)) avatars.push({ name: wanted });
  for (const a of avatars) ui.picker.add(new Option(a.name, a.name));
  ui.picker.value = wanted || data.default || avatars[0].name;
  ui.pickerField.hidden = false;
  showAvatar(currentAvatar());
}

// Video size and codec: ?size=1280x720 and ?codec=vp8|h264 set the pickers' first choice.
const CODEC_MIME = { vp8: 'video/VP8', h264: 'video/H264' };
function fillSizeAndCodec(config) {
  const cap = /^(\d+)x(\d+)$/.exec(config?.max_output_size ?? '');
  const [capLong, capShort] = cap ? [Math.max(+cap[1], +cap[2]), Math.min(+cap[1], +cap[2])] : [1920, 1080];
  for (const size of ['640x360', '1280x720', '1920x1080']) {
    const [w, h] = size.split('x').map(Number);
    if (Math.max(w, h) <= capLong && Math.min(w, h) <= capShort) ui.size.add(new Option(size, size));
  }
  const wantedSize = params.get('size');
  if (wantedSize && ![...ui.size.options].some((o) => o.value === wantedSize)) ui.size.add(new Option(wantedSize, wantedSize));
  ui.size.value = wantedSize || '';
  const wantedCodec = (params.get('codec') || '').toLowerCase();
  ui.codec.value = wantedCodec in CODEC_MIME ? wantedCodec : '';
}
const chosenSize = () => ui.size.value || null;
const chosenCodec = () => ui.codec.value || null;

const currentAvatar = () => avatars.find((a) => a.name === ui.picker.value) ?? null;
const chosenAvatarName = () => (avatars.length ? ui.picker.value : params.get('avatar')) || null;

/** Poster image and aspect ratio of an avatar, before or during a call. */
function showAvatar(a) {
  if (!a) return;
  if (a.preview_url) ui.video.poster = new URL(a.preview_url, API).href;
  if (a.width > 0 && a.height > 0) ui.video.style.aspectRatio = `${a.width} / ${a.height}`;
}

const ready = Promise.all([getJson('config'), getJson('avatars')]).then(([config, list]) => {
  if (Array.isArray(config?.ice_servers)) {
    iceServers = config.ice_servers.filter((s) => s && s.urls);
  }
  fillPicker(list);
  fillSizeAndCodec(config);
});

// ---- the call ----

async function start() {
  if (call) return state;
  showError('');
  latestStats = null;
  setState('connecting');
  const c = (call = { done: false, abort: new AbortController(), meta: null, metaCount: 0 });
  try {
    await ready;
    await connect(c);
  } catch (err) {
    if (!c.done) { // when done, stop() already ended this call and this error is its echo
      console.error(err);
      showError(describe(err));
      teardown(c, 'failed');
    }
  }
  return state;
}

function stop() {
  if (call) teardown(call, 'closed');
  return state;
}

async function connect(c) {
  const checkStopped = () => {
    if (c.done) throw new DOMException('call stopped', 'AbortError');
  };
  setConn('requesting microphone…', 'busy');
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new UserError('Microphone access needs a secure page: open it over https:// or on localhost.');
  }
  const mic = await navigator.mediaDevices.getUserMedia({ audio: MIC_CONSTRAINTS, video: false });
  if (c.done) mic.getTracks().forEach((t) => t.stop()); // Stop pressed during the permission prompt
  checkStopped();
  c.mic = mic;
  c.meter = levelMeter(mic, (level) => { ui.level.value = level; });

  const pc = (c.pc = new RTCPeerConnection({ iceServers }));
  pc.addEventListener('iceconnectionstatechange', () => onPeerState(c));
  pc.addEventListener('connectionstatechange', () => onPeerState(c));
  pc.addEventListener('track', (ev) => onTrack(c, ev));

  // The client opens the "meta" channel before the offer, so the offer carries SCTP
  // and the server needs no renegotiation to send per-frame metadata on it.
  c.dc = pc.createDataChannel('meta', { ordered: true });
  c.dc.addEventListener('message', (ev) => onMeta(c, ev));
  c.dc.addEventListener('close', () => {
    if (!c.done && state === 'connected') {
      showError('The server ended the session.');
      teardown(c, 'closed');
    }
  });

  pc.addTransceiver(c.mic.getAudioTracks()[0], { direction: 'sendrecv', streams: [c.mic] });
  const video = pc.addTransceiver('video', { direction: 'recvonly' });
  const codec = chosenCodec();
  if (codec) preferCodec(video, CODEC_MIME[codec], true);
  else preferCodec(video, 'video/VP8'); // first in the offer; the server's own preference decides
  for (const t of pc.getTransceivers()) lowLatency(t.receiver);
  c.remote = new MediaStream();

  await pc.setLocalDescription(await pc.createOffer());
  // No trickle ICE: the offer is sent once, with every candidate in it.
  setConn('gathering network candidates…', 'busy');
  await iceGatheringDone(pc, ICE_GATHER_TIMEOUT_MS);
  checkStopped();

  setConn('waiting for the server…', 'busy');
  const size = chosenSize();
  const options = { ...enhanceOptions(), ...(size ? { size } : {}) };
  const answer = await postOffer(pc.localDescription, chosenAvatarName(), c.abort.signal, options);
  c.sessionId = answer.session_id ?? null;
  showWatch(c.sessionId);
  if (c.done) { // stopped while the server was answering: end the session it just made
    deleteSession(c.sessionId);
    checkStopped();
  }
  c.avatar = answer.avatar ?? null;
  showAvatar(c.avatar);
  await pc.setRemoteDescription({ type: 'answer', sdp: answer.sdp });
  checkStopped();
  ui.video.srcObject = c.remote;
  playVideo();
  onPeerState(c);
  c.statsTimer = setInterval(() => pollStats(c), STATS_INTERVAL_MS);
}

function onTrack(c, ev) {
  // The server may put audio and video in different streams (or none), so both remote
  // tracks are gathered into one MediaStream: one element plays picture and voice, and the
  // browser keeps them in sync. (WebAudio alone would be silent on a remote stream.)
  // Tracks arrive during setRemoteDescription; the element gets the stream right after it.
  c.remote.addTrack(ev.track);
}

function playVideo() {
  ui.video.play().catch((err) => {
    if (err.name !== 'NotAllowedError') return; // AbortError: a newer load replaced this one
    // Autoplay with sound was refused (no user gesture, e.g. ?autostart=1): play muted, offer sound.
    ui.video.muted = true;
    ui.video.play().catch(() => {});
    ui.unmute.hidden = false;
  });
}

function onPeerState(c) {
  if (c.done) return;
  const { pc } = c;
  const conn = pc.connectionState ?? pc.iceConnectionState; // connectionState is missing in old browsers
  const level = { connected: 'ok', failed: 'bad', closed: 'off', disconnected: 'warn' }[conn] ?? 'busy';
  setConn(`ICE ${pc.iceConnectionState} · connection ${conn}`, level);
  if (conn === 'connected' && state === 'connecting') setState('connected');
  if (conn === 'failed') {
    showError('Connection failed: no network path to the server (ICE failed). '
      + 'A firewall may block UDP; the server may need a TURN server in /config.');
    teardown(c, 'failed');
  }
}

function onMeta(c, ev) {
  try {
    const meta = JSON.parse(ev.data);
    if (meta && typeof meta === 'object') {
      c.meta = meta;
      c.metaCount += 1;
    }
  } catch {
    // not JSON: ignore, the channel is informational
  }
}

async function pollStats(c) {
  let report;
  try {
    report = await c.pc.getStats();
  } catch {
    return;
  }
  if (c.done) return;
  const summary = summarizeStats(report, c.prevStats);
  c.prevStats = summary;
  latestStats = {
    ...summary, micLevel: c.meter?.level() ?? null, meta: c.meta, metaCount: c.metaCount,
    sessionId: c.sessionId, avatar: c.avatar?.name ?? null,
  };
  ui.stats.textContent = formatStats(latestStats);
}

/** End a call and release everything it holds. Safe to call more than once. */
function teardown(c, finalState) {
  if (c.done) return;
  c.done = true;
  c.abort.abort();
  clearInterval(c.statsTimer);
  c.meter?.close();
  deleteSession(c.sessionId);
  try { c.dc?.close(); } catch { /* already closed */ }
  c.pc?.close();
  c.mic?.getTracks().forEach((t) => t.stop());
  if (ui.video.srcObject === c.remote) ui.video.srcObject = null;
  ui.video.muted = false;
  ui.unmute.hidden = true;
  ui.level.value = 0;
  showWatch(null);
  if (call === c) call = null;
  setConn(finalState, finalState === 'failed' ? 'bad' : 'off');
  setState(finalState);
}

/** The viewer page and WHEP URL of this call's session: OBS (or anyone) can watch it without a microphone. */
function showWatch(sessionId) {
  ui.watch.hidden = !sessionId;
  if (!sessionId) return;
  const viewer = new URL('static/viewer.html', API);
  viewer.searchParams.set('session', sessionId);
  const token = params.get('token');
  if (token) viewer.searchParams.set('token', token);
  ui.watchLink.href = viewer.href;
  ui.whepUrl.textContent = new URL(`whep/${encodeURIComponent(sessionId)}`, API).href;
}

function describe(err) {
  if (err instanceof UserError) return err.message;
  switch (err?.name) {
    case 'NotAllowedError':
      return 'Microphone permission was denied. Allow microphone access for this page and press Start again.';
    case 'NotFoundError':
    case 'OverconstrainedError':
      return 'No microphone was found.';
    case 'NotReadableError':
      return 'The microphone could not be opened (is another application using it?).';
    default:
      return `Unexpected error: ${err?.message ?? err}`;
  }
}

// ---- wiring ----

ui.start.addEventListener('click', () => start());
ui.stop.addEventListener('click', () => stop());
ui.picker.addEventListener('change', () => showAvatar(currentAvatar()));
ui.unmute.addEventListener('click', () => {
  ui.video.muted = false;
  ui.unmute.hidden = true;
  ui.video.play().catch(() => {});
});
// Leaving the page ends the session on the server too.
window.addEventListener('pagehide', () => stop());

// Test hook for headless browsers: wait on document.body.dataset.state or poll these.
window.lipcast = {
  start,
  stop,
  state: () => state,
  stats: () => (latestStats ? { ...latestStats } : null),
};

setState('idle');
if (params.get('autostart') === '1') start();
