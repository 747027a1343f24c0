"""A WHIP source or a WHEP viewer made of GStreamer's webrtcbin (Debian's GStreamer and PyGObject: run it
with the system's python3, not the project's virtualenv). Prints one JSON object at the end.

``whip``: sends a test tone (Opus) and a test picture (VP8), the way Meetecho's simple-whip-client does: the
offer goes out before any candidate is gathered and every candidate follows by PATCH
(``application/trickle-ice-sdpfrag`` with ``If-Match``), then ``a=end-of-candidates``; after ``--seconds``
connected it DELETEs its resource. ``whep``: offers recvonly VP8 and Opus with its gathered candidates,
decodes what comes back for ``--seconds`` after the first frame and reports the frames' times and the audio
samples decoded.

    /usr/bin/python3 tests/interop/gst_client.py whep --url http://HOST:PORT/whep/SESSION [--token T]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("GstWebRTC", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402

VIDEO_CAPS = "application/x-rtp,media=video,encoding-name=VP8,payload=96,clock-rate=90000"
AUDIO_CAPS = "application/x-rtp,media=audio,encoding-name=OPUS,payload=111,clock-rate=48000,encoding-params=2"
SOURCE = (
    "webrtcbin name=webrtc bundle-policy=max-bundle "
    "audiotestsrc is-live=true wave=sine freq=440 ! audioconvert ! audioresample ! opusenc ! "
    "rtpopuspay pt=111 ! application/x-rtp,media=audio,encoding-name=OPUS,payload=111 ! webrtc. "
    "videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,framerate=25/1 ! "
    f"videoconvert ! vp8enc deadline=1 cpu-used=8 ! rtpvp8pay pt=96 ! {VIDEO_CAPS} ! webrtc."
)
TRICKLE = "application/trickle-ice-sdpfrag"


class Client:
    def __init__(self, args: argparse.Namespace) -> None:
        self.mode, self.url, self.token, self.seconds = args.mode, args.url, args.token, args.seconds
        self.timeout_s, self.setup = args.timeout_s, args.setup
        self.loop = GLib.MainLoop()
        if self.mode == "whip":
            self.pipeline = Gst.parse_launch(SOURCE)
            self.webrtc = self.pipeline.get_by_name("webrtc")
        else:
            self.pipeline = Gst.Pipeline.new("whep")
            self.webrtc = Gst.ElementFactory.make("webrtcbin", "webrtc")
            self.webrtc.set_property("bundle-policy", GstWebRTC.WebRTCBundlePolicy.MAX_BUNDLE)
            self.pipeline.add(self.webrtc)
        self.result: dict[str, Any] = {"mode": self.mode, "frames": [], "audio_samples": 0, "errors": []}
        self.result["patches"] = []
        self.lock = threading.Lock()
        self.first_frame: float | None = None
        self.resource: str | None = None
        self.etag: str | None = None
        self.ufrag = ""
        self.mids: list[str] = []
        self.pending: list[tuple[int, str | None]] = []  # candidates gathered before the POST's answer
        self.posted = False
        self.offered = False
        if self.mode == "whep":
            for caps in (VIDEO_CAPS, AUDIO_CAPS):
                direction = GstWebRTC.WebRTCRTPTransceiverDirection.RECVONLY
                self.webrtc.emit("add-transceiver", direction, Gst.Caps.from_string(caps))
            self.webrtc.connect("notify::ice-gathering-state", self.on_gathering)
            self.webrtc.connect("pad-added", self.on_webrtc_pad)
        else:  # as simple-whip-client: sendonly (webrtcbin's transceivers for linked pads are sendrecv)
            for index in range(2):
                transceiver = self.webrtc.emit("get-transceiver", index)
                transceiver.set_property("direction", GstWebRTC.WebRTCRTPTransceiverDirection.SENDONLY)
            self.webrtc.connect("on-ice-candidate", self.on_ice_candidate)
            self.webrtc.connect("notify::ice-gathering-state", self.on_gathering)
        self.webrtc.connect("on-negotiation-needed", self.on_negotiation_needed)
        self.webrtc.connect("notify::connection-state", self.on_connection_state)
        bus = self.pipeline.get_bus()
        bus.add_signal_watch()
        bus.connect("message::error", self.on_error)

    # -- HTTP --

    def request(
        self, method: str, url: str, body: str | None, content_type: str | None
    ) -> tuple[int, Any, str]:
        headers = {"Content-Type": content_type} if content_type else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if method == "PATCH" and self.etag:
            headers["If-Match"] = self.etag
        data = body.encode() if body is not None else None
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, response.headers, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode(errors="replace")

    # -- signalling --

    def on_negotiation_needed(self, element: Any) -> None:
        promise = Gst.Promise.new_with_change_func(self.on_offer, None)
        element.emit("create-offer", None, promise)

    def on_offer(self, promise: Any, _: Any) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None and reply.has_field("offer") else None
        if offer is None:
            self.result["errors"].append(f"create-offer failed: {reply.to_string() if reply else None}")
            return
        if self.offered:
            return
        self.offered = True
        if self.mode == "whip":  # at once, before any candidate: they follow by PATCH
            applied = Gst.Promise.new_with_change_func(lambda *_: GLib.idle_add(self.post_offer), None)
        else:
            applied = Gst.Promise.new()
        self.webrtc.emit("set-local-description", offer, applied)

    def on_gathering(self, element: Any, _: Any) -> None:
        if element.get_property("ice-gathering-state") != GstWebRTC.WebRTCICEGatheringState.COMPLETE:
            return
        if self.mode == "whep":
            GLib.idle_add(self.post_offer)
        else:
            GLib.idle_add(self.trickle, 0, None)  # end-of-candidates

    def post_offer(self) -> bool:
        if self.posted:
            return False
        self.posted = True
        offer = self.webrtc.get_property("local-description").sdp.as_text()
        self.ufrag = next((line[12:] for line in offer.splitlines() if line.startswith("a=ice-ufrag:")), "")
        self.mids = [line[6:] for line in offer.splitlines() if line.startswith("a=mid:")]
        if self.mode == "whip":  # candidates only by PATCH, whatever was gathered meanwhile
            offer = "".join(
                line for line in offer.splitlines(True) if not line.startswith(("a=candidate:", "a=end-of"))
            )
        if (
            self.setup != "actpass"
        ):  # the DTLS role the offer asks lipcast to take (webrtcbin follows the answer)
            offer = offer.replace("a=setup:actpass", f"a=setup:{self.setup}")
        self.result["offer_candidates"] = offer.count("a=candidate:")
        status, headers, answer = self.request("POST", self.url, offer, "application/sdp")
        self.result["answer_setup"] = sorted(
            {line[8:] for line in answer.splitlines() if line.startswith("a=setup:")}
        )
        self.result["status"] = status
        if status != 201:
            self.result["errors"].append(f"POST {status}: {answer[:500]}")
            self.loop.quit()
            return False
        self.result["content_type"] = headers.get("Content-Type")
        self.resource = urllib.parse.urljoin(self.url, headers.get("Location"))
        self.etag = headers.get("ETag")
        self.result["answer_candidates"] = answer.count("a=candidate:")
        _, message = GstSdp.SDPMessage.new_from_text(answer)
        description = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, message)
        self.webrtc.emit("set-remote-description", description, Gst.Promise.new())
        pending, self.pending = self.pending, []
        for mline, candidate in pending:
            self.trickle(mline, candidate)
        return False

    def on_ice_candidate(self, element: Any, mline: int, candidate: str) -> None:
        GLib.idle_add(self.trickle, mline, candidate)

    def trickle(self, mline: int, candidate: str | None) -> bool:
        """One PATCH per candidate (None: end-of-candidates), as simple-whip-client sends them."""
        if self.resource is None:
            self.pending.append((mline, candidate))
            return False
        mid = self.mids[mline] if mline < len(self.mids) else str(mline)
        lines = [f"a=ice-ufrag:{self.ufrag}", "m=audio 9 UDP/TLS/RTP/SAVPF 0", f"a=mid:{mid}"]
        lines.append(f"a={candidate}" if candidate is not None else "a=end-of-candidates")
        status, _, body = self.request("PATCH", self.resource, "\r\n".join(lines) + "\r\n", TRICKLE)
        self.result["patches"].append(status)
        if status != 204:
            self.result["errors"].append(f"PATCH {status}: {body[:300]}")
        return False

    def on_connection_state(self, element: Any, _: Any) -> None:
        state = element.get_property("connection-state")
        self.result.setdefault("states", []).append(state.value_nick)
        if state == GstWebRTC.WebRTCPeerConnectionState.FAILED:
            self.result["errors"].append("connection failed")
            GLib.idle_add(self.loop.quit)
        elif state == GstWebRTC.WebRTCPeerConnectionState.CONNECTED and self.mode == "whip":
            self.result["connected_at"] = time.monotonic()
            GLib.timeout_add(int(self.seconds * 1000), self.finish)

    def finish(self) -> bool:
        if self.resource is not None:
            status, _, _ = self.request("DELETE", self.resource, None, None)
            self.result["delete"] = status
        self.loop.quit()
        return False

    # -- media (whep) --

    def on_webrtc_pad(self, element: Any, pad: Any) -> None:
        if pad.direction != Gst.PadDirection.SRC:
            return
        decode = Gst.ElementFactory.make("decodebin")
        decode.connect("pad-added", self.on_decoded_pad)
        self.pipeline.add(decode)
        decode.sync_state_with_parent()
        pad.link(decode.get_static_pad("sink"))

    def on_decoded_pad(self, element: Any, pad: Any) -> None:
        video = pad.get_current_caps().get_structure(0).get_name().startswith("video")
        convert = Gst.ElementFactory.make("videoconvert" if video else "audioconvert")
        sink = Gst.ElementFactory.make("fakesink")
        sink.set_property("signal-handoffs", True)
        sink.set_property("sync", False)
        sink.connect("handoff", self.on_video if video else self.on_audio)
        for e in (convert, sink):
            self.pipeline.add(e)
            e.sync_state_with_parent()
        convert.link(sink)
        pad.link(convert.get_static_pad("sink"))

    def on_video(self, sink: Any, buffer: Any, pad: Any) -> None:
        now = time.monotonic()
        with self.lock:
            if self.first_frame is None:
                self.first_frame = now
                caps = pad.get_current_caps().get_structure(0)
                self.result["video_size"] = [caps.get_value("width"), caps.get_value("height")]
                GLib.timeout_add(int(self.seconds * 1000), self.finish)
            self.result["frames"].append(round(now - self.first_frame, 4))

    def on_audio(self, sink: Any, buffer: Any, pad: Any) -> None:
        rate = pad.get_current_caps().get_structure(0).get_value("rate")
        samples = int(buffer.duration * rate / Gst.SECOND) if buffer.duration != Gst.CLOCK_TIME_NONE else 0
        now = time.monotonic()
        with self.lock:
            if self.first_frame is None or now - self.first_frame > self.seconds:
                return  # counted over the frames' window
            self.result["audio_rate"] = rate
            self.result["audio_samples"] += samples

    def on_error(self, bus: Any, message: Any) -> None:
        error, debug = message.parse_error()
        self.result["errors"].append(f"{error.message} ({debug})"[:500])
        self.loop.quit()

    def run(self) -> dict[str, Any]:
        self.pipeline.set_state(Gst.State.PLAYING)
        GLib.timeout_add(int(self.timeout_s * 1000), self.give_up)
        self.loop.run()
        self.pipeline.set_state(Gst.State.NULL)
        self.result["seconds"] = self.seconds
        self.result["gstreamer"] = Gst.version_string()
        return self.result

    def give_up(self) -> bool:
        if "connected_at" not in self.result and self.first_frame is None:
            self.result["errors"].append(f"not connected within {self.timeout_s:g} s")
            self.loop.quit()
        return False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("whip", "whep"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--token")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--setup", choices=("actpass", "passive"), default="actpass", help="a=setup offered")
    args = parser.parse_args()
    Gst.init(None)
    json.dump(Client(args).run(), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
