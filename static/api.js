// The server's HTTP contract: GET /config, GET /avatars, POST /offer, DELETE /sessions/{id}.

// The server root: these modules are served from <root>/static/, so the API stays
// reachable when the whole app sits behind a path prefix.
export const API = new URL('../', import.meta.url);

/** ?token= of the page: sent as a bearer token when the server runs with --auth-token. */
export function authHeaders() {
  const token = new URLSearchParams(location.search).get('token');
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** An error whose message is meant for the user as it is. */
export class UserError extends Error {}

/** Seconds from a Retry-After header: "120" or an HTTP date. null when absent or unreadable. */
export function retryAfterSeconds(header, nowMs = Date.now()) {
  if (!header) return null;
  const value = header.trim();
  if (/^\d+$/.test(value)) return Number(value);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, Math.ceil((at - nowMs) / 1000));
}

/** GET an optional endpoint: its JSON, or null when it is missing (404) or broken. */
export async function getJson(path) {
  try {
    const res = await fetch(new URL(path, API), { headers: { Accept: 'application/json' } });
    if (res.ok) return await res.json();
    if (res.status !== 404) console.warn(`GET /${path}: HTTP ${res.status}`);
  } catch (err) {
    console.warn(`GET /${path} failed`, err);
  }
  return null;
}

/**
 * POST the (fully gathered) offer, with ``options`` such as {face_enhance, face_enhance_strength, size} in
 * the same JSON; resolves to the answer
 * {sdp, type, session_id, avatar: {name, width, height, mouth_box}, size, codec}.
 * `size`: "WIDTHxHEIGHT" for the video (absent: the avatar's own).
 * Server errors become a UserError carrying the server's {"error"} message.
 */
export async function postOffer(desc, avatar, signal, options = {}) {
  const body = { sdp: desc.sdp, type: desc.type, ...options };
  if (avatar) body.avatar = avatar;
  let res;
  try {
    res = await fetch(new URL('offer', API), {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json', ...authHeaders() },
      body: JSON.stringify(body),
      signal,
    });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new UserError('Cannot reach the lipcast server. Is it running?');
  }
  const data = await res.json().catch(() => null);
  if (!res.ok) {
    let message = (typeof data?.error === 'string' && data.error) || `Server error: HTTP ${res.status}`;
    if (res.status === 503) {
      const s = retryAfterSeconds(res.headers.get('Retry-After'));
      message += s === null ? ' Please try again shortly.' : ` Please try again in ${s} s.`;
    }
    throw new UserError(message);
  }
  if (typeof data?.sdp !== 'string') throw new UserError('The server sent an invalid answer (no SDP).');
  return data;
}

/** End a session on the server; fire and forget. */
export function deleteSession(id) {
  if (!id) return;
  // keepalive lets the request outlive the page on pagehide (sendBeacon cannot DELETE).
  fetch(new URL(`sessions/${encodeURIComponent(id)}`, API), {
    method: 'DELETE', headers: authHeaders(), keepalive: true,
  }).catch(() => {});
}
