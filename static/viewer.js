// lipcast viewer: a WHEP client (draft-ietf-wish-whep) for OBS's Browser Source. It watches one session's
// avatar and voice, receive-only: it never touches a microphone. No controls; it reconnects by itself.
//   ?session=ID        watch this session (the call page shows the link), or
//   ?whep=URL          any WHEP endpoint
//   ?bg=green          chroma-key green around the avatar (default); transparent | black | white | RRGGBB
//   ?token=T           bearer token, when the server was started with --auth-token
//   ?debug=1           show the connection state in a corner
//   ?size=1280x720     the video's size (default: the session's); ?codec=vp8|h264 (default: the server's)
import { iceGatheringDone, lowLatency, preferCodec } from './rtc.js';

const params = new URLSearchParams(location.search);
const ICE_GATHER_TIMEOUT_MS = 3000;
const RETRY_MIN_MS = 2000;
const RETRY_MAX_MS = 15000;
const BACKGROUNDS = { green: '#00ff00', transparent: 'transparent', black: '#000000', white: '#ffffff' };

const video = document.getElementById('avatar');
const status = document.getElementById('status');
status.hidden = params.get('debug') !== '1';

let state = 'idle'; // idle | connecting | playing | waiting | failed
let current = null; // {pc, resource, done}
let retryMs = RETRY_MIN_MS;
let retryTimer = 0;

/** The page background: a named colour, "transparent" or RRGGBB / #RRGGBB; green when absent or invalid. */
export function backgroundColour(value) {
  const v = (value ?? 'green').trim().toLowerCase();
  if (v in BACKGROUNDS) return BACKGROUNDS[v];
  const hex = v.replace(/^#/, '');
  return /^([0-9a-f]{3}|[0-9a-f]{6})$/.test(hex) ? `#${hex}` : BACKGROUNDS.green;
}

function endpoint() {
  const whep = params.get('whep');
  const session = params.get('session');
  let url = null;
  if (whep) url = new URL(whep, location.href);
  else if (session) url = new URL(`../whep/${encodeURIComponent(session)}`, import.meta.url);
  if (url && params.get('size')) url.searchParams.set('size', params.get('size'));
  return url;
}

const CODEC_MIME = { vp8: 'video/VP8', h264: 'video/H264' };

function authHeaders() {
  const token = params.get('token');
  return token ? { Authorization: `Bearer ${token}` } : {};
}

function setState(next, detail = '') {
  state = next;
  document.body.dataset.state = next;
  status.textContent = detail ? `${next}: ${detail}` : next;
}

function retry(afterMs, reason) {
  clearTimeout(retryTimer);
  const wait = afterMs ?? retryMs;
  retryMs = Math.min(RETRY_MAX_MS, retryMs * 2);
  setState('waiting', `${reason}; retrying in ${Math.round(wait / 1000)} s`);
  retryTimer = setTimeout(connect, wait);
}

function teardown(c) {
  if (!c || c.done) return;
  c.done = true;
  if (c.resource) {
    fetch(c.resource, { method: 'DELETE', headers: authHeaders(), keepalive: true }).catch(() => {});
  }
  c.pc.close();
  if (current === c) current = null;
}

async function connect() {
  const url = endpoint();
  if (!url) {
    setState('failed', 'no ?session= or ?whep= in the address');
    return;
  }
  teardown(current);
  const c = (current = { pc: new RTCPeerConnection({ iceServers: [] }), resource: null, done: false });
  const { pc } = c;
  const stream = new MediaStream();
  setState('connecting');
  const videoTransceiver = pc.addTransceiver('video', { direction: 'recvonly' });
  const codec = CODEC_MIME[(params.get('codec') || '').toLowerCase()];
  if (codec) preferCodec(videoTransceiver, codec, true);
  pc.addTransceiver('audio', { direction: 'recvonly' });
  for (const t of pc.getTransceivers()) lowLatency(t.receiver);
  pc.addEventListener('track', (ev) => stream.addTrack(ev.track));
  pc.addEventListener('connectionstatechange', () => {
    if (c.done) return;
    if (pc.connectionState === 'connected') {
      retryMs = RETRY_MIN_MS;
      setState('playing');
    } else if (['failed', 'closed', 'disconnected'].includes(pc.connectionState)) {
      // The session ended (or the network went): start over; a new POST tells which.
      teardown(c);
      retry(null, `connection ${pc.connectionState}`);
    }
  });
  try {
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringDone(pc, ICE_GATHER_TIMEOUT_MS); // no trickle: one complete offer
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'Content-Type': 'application/sdp', ...authHeaders() },
      body: pc.localDescription.sdp,
    });
    if (c.done) return;
    if (res.status !== 201) {
      const body = await res.json().catch(() => ({}));
      const after = Number(res.headers.get('Retry-After'));
      teardown(c);
      // 404: no such session (yet, or any more); 503: full. Both may change, so keep trying.
      retry(after > 0 ? after * 1000 : null, body.error || `HTTP ${res.status}`);
      return;
    }
    c.resource = new URL(res.headers.get('Location'), url).href;
    await pc.setRemoteDescription({ type: 'answer', sdp: await res.text() });
    video.srcObject = stream;
    play();
  } catch (err) {
    if (c.done) return;
    console.error(err);
    teardown(c);
    retry(null, err.message || String(err));
  }
}

function play() {
  video.muted = false;
  video.play().catch((err) => {
    if (err.name !== 'NotAllowedError') return;
    // A normal browser refuses sound without a click (OBS's Browser Source allows it): play muted and
    // turn the sound on at the first click anywhere.
    video.muted = true;
    video.play().catch(() => {});
    window.addEventListener('pointerdown', () => { video.muted = false; }, { once: true });
  });
}

document.documentElement.style.setProperty('--bg', backgroundColour(params.get('bg')));
window.addEventListener('pagehide', () => teardown(current));
// Test hook for headless browsers.
window.lipcastViewer = { state: () => state, muted: () => video.muted };
connect();
