// A WHIP source shaped like OBS Studio's (30.x, plugins/obs-webrtc/whip-output.cpp), on the library OBS uses:
// libdatachannel, through node-datachannel. The same media descriptions as OBS (audio mid 0: Opus pt 111,
// sendonly, one SSRC; video mid 1: H.264 pt 96, sendonly), the offer POSTed as OBS sends it: no candidates,
// with or without a=end-of-candidates (--end-of-candidates yes|no). Then the Opus packets of --opus
// (length-prefixed 20 ms packets) go out as RTP in real time until SIGTERM, when it DELETEs its resource
// (as OBS does on stop) and prints one JSON line. Run by tests/interop/drive.py (client "obs").
import fs from 'node:fs';
import { parseArgs } from 'node:util';
import nodeDataChannel from 'node-datachannel';

const { values: args } = parseArgs({
  options: {
    url: { type: 'string' },
    token: { type: 'string' },
    opus: { type: 'string' },
    'end-of-candidates': { type: 'string', default: 'yes' },
  },
});
const result = { library: 'libdatachannel (node-datachannel)', states: [], packets_sent: 0, errors: [] };
const started = Date.now();
const headers = (type) => ({
  ...(type ? { 'Content-Type': type } : {}),
  ...(args.token ? { Authorization: `Bearer ${args.token}` } : {}),
});

function opusPackets(path) {
  const data = fs.readFileSync(path);
  const packets = [];
  for (let at = 0; at + 2 <= data.length; ) {
    const length = data.readUInt16BE(at);
    packets.push(data.subarray(at + 2, at + 2 + length));
    at += 2 + length;
  }
  return packets;
}

function rtp(payload, sequence, timestamp, ssrc, marker) {
  const header = Buffer.alloc(12);
  header[0] = 0x80;
  header[1] = (marker ? 0x80 : 0) | 111;
  header.writeUInt16BE(sequence & 0xffff, 2);
  header.writeUInt32BE(timestamp >>> 0, 4);
  header.writeUInt32BE(ssrc, 8);
  return Buffer.concat([header, payload]);
}

// OBS's shape: what libdatachannel describes, then candidates removed (OBS sends the offer before they are
// gathered) and end-of-candidates kept or not.
function obsOffer(sdp, endOfCandidates) {
  const lines = sdp.split(/\r?\n/).filter((l) => l && !l.startsWith('a=candidate:') && l !== 'a=end-of-candidates');
  const out = [];
  for (const line of lines) {
    out.push(line.startsWith('c=IN IP4') ? 'c=IN IP4 0.0.0.0' : line.replace(/^(m=\w+) \d+ /, '$1 9 '));
    if (endOfCandidates && line.startsWith('a=ice-pwd:')) out.push('a=end-of-candidates');
  }
  return out.join('\r\n') + '\r\n';
}

const audioSsrc = 0x4f425341;
const pc = new nodeDataChannel.PeerConnection('obs', { iceServers: [] });
pc.onStateChange((state) => result.states.push([state, Date.now() - started]));
const audio = new nodeDataChannel.Audio('0', 'SendOnly');
audio.addOpusCodec(111);
audio.addSSRC(audioSsrc, 'obs-cname', 'obs-stream', 'obs-audio');
const audioTrack = pc.addTrack(audio);
const video = new nodeDataChannel.Video('1', 'SendOnly');
video.addH264Codec(96);
video.addSSRC(0x4f425356, 'obs-cname', 'obs-stream', 'obs-video');
pc.addTrack(video);
pc.setLocalDescription();

let resource = null;
let timer = null;
async function finish() {
  clearInterval(timer);
  if (resource) {
    try {
      result.delete = (await fetch(resource, { method: 'DELETE', headers: headers() })).status;
    } catch (e) {
      result.errors.push(`DELETE: ${e}`);
    }
  }
  pc.close();
  console.log(JSON.stringify(result));
  process.exit(0);
}
process.on('SIGTERM', finish);
process.on('SIGINT', finish);

const offer = obsOffer(pc.localDescription().sdp, args['end-of-candidates'] === 'yes');
result.offer_candidates = (offer.match(/a=candidate:/g) || []).length;
result.offer_end_of_candidates = offer.includes('a=end-of-candidates');
const posted = Date.now();
const response = await fetch(args.url, { method: 'POST', body: offer, headers: headers('application/sdp') });
result.status = response.status;
result.answer_ms = Date.now() - posted;
result.content_type = response.headers.get('content-type');
const answer = await response.text();
if (response.status !== 201) {
  result.errors.push(`POST ${response.status}: ${answer.slice(0, 300)}`);
  await finish();
}
resource = new URL(response.headers.get('location'), args.url).href;
result.answer_candidates = (answer.match(/a=candidate:/g) || []).length;
result.answer_setup = [...new Set(answer.match(/a=setup:\w+/g))];
pc.setRemoteDescription(answer, 'answer');

const packets = opusPackets(args.opus);
audioTrack.onOpen(() => {
  result.track_open_ms = Date.now() - started;
  const t0 = Date.now();
  let next = 0;
  timer = setInterval(() => {
    // Catch up to real time in 20 ms steps (a timer that fires late sends what is due).
    while (next < packets.length && next * 20 <= Date.now() - t0) {
      audioTrack.sendMessageBinary(rtp(packets[next], next, next * 960, audioSsrc, next === 0));
      result.packets_sent = ++next;
    }
  }, 5);
});
