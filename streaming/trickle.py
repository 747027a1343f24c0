"""Trickle ICE over HTTP (RFC 9725 section 4.3, RFC 8840 fragments): a client's later candidates, added to a
live peer connection.

A fragment (``application/trickle-ice-sdpfrag``) names the ICE credentials it belongs to, media sections by
``a=mid``, their ``a=candidate`` lines and ``a=end-of-candidates``. Credentials other than the session's
mean an ICE restart, which aioice cannot do on a live connection (:class:`IceRestartError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiortc import RTCIceCandidate, RTCPeerConnection, sdp
from aiortc.rtcicetransport import RTCIceTransport

TRICKLE_CONTENT_TYPE = "application/trickle-ice-sdpfrag"


class FragmentError(ValueError):
    """The fragment does not parse."""


class IceRestartError(Exception):
    """The fragment asks for an ICE restart."""


@dataclass
class IceFragment:
    ufrag: str | None = None
    pwd: str | None = None
    candidates: list[RTCIceCandidate] = field(default_factory=list)  # sdpMid set where the fragment says
    end_of_candidates: bool = False


def parse_fragment(text: str) -> IceFragment:
    """The credentials, candidates and end-of-candidates of a fragment; :class:`FragmentError` if bad."""
    fragment = IceFragment()
    mid: str | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("m="):
            mid = None
        elif line.startswith("a=mid:"):
            mid = line.removeprefix("a=mid:").strip()
        elif line.startswith("a=ice-ufrag:"):
            fragment.ufrag = line.removeprefix("a=ice-ufrag:").strip()
        elif line.startswith("a=ice-pwd:"):
            fragment.pwd = line.removeprefix("a=ice-pwd:").strip()
        elif line.startswith("a=candidate:"):
            try:
                candidate = sdp.candidate_from_sdp(line.removeprefix("a=candidate:"))
            except (AssertionError, ValueError, IndexError) as e:
                raise FragmentError(f"line {number}: not an ICE candidate: {line[:200]!r}") from e
            candidate.sdpMid = mid
            fragment.candidates.append(candidate)
        elif line == "a=end-of-candidates":
            fragment.end_of_candidates = True
        elif not line[1:2] == "=":
            raise FragmentError(f"line {number}: not an SDP line: {line[:200]!r}")
    return fragment


def remote_ufrag(pc: RTCPeerConnection) -> str | None:
    """The ICE username fragment of the applied remote description."""
    remote = pc.remoteDescription
    if remote is None:
        return None
    for media in sdp.SessionDescription.parse(remote.sdp).media:
        if media.ice is not None:
            return media.ice.usernameFragment
    return None


def ice_transports(pc: RTCPeerConnection) -> dict[str | None, RTCIceTransport]:
    """Each media section's ICE transport by mid (bundled sections share one); ``None``: the first's."""
    by_mid: dict[str | None, RTCIceTransport] = {}
    for transceiver in pc.getTransceivers():
        transport = transceiver.receiver.transport.transport
        by_mid.setdefault(None, transport)
        by_mid[transceiver.mid] = transport
    if pc.sctp is not None:
        by_mid.setdefault(None, pc.sctp.transport.transport)
        by_mid[pc.sctp.mid] = pc.sctp.transport.transport
    return by_mid


async def add_fragment(pc: RTCPeerConnection, fragment: IceFragment) -> int:
    """Add the fragment's candidates (and end-of-candidates) to ``pc``; returns how many were added.

    :class:`IceRestartError` when its credentials are not the session's; :class:`FragmentError` for a mid the
    session does not have.
    """
    current = remote_ufrag(pc)
    if fragment.ufrag is not None and current is not None and fragment.ufrag != current:
        raise IceRestartError(f"the fragment's ice-ufrag {fragment.ufrag!r} is not the session's")
    transports = ice_transports(pc)
    if not transports:
        raise FragmentError("the session has no ICE transport")
    for candidate in fragment.candidates:
        transport = transports.get(candidate.sdpMid)
        if transport is None:
            raise FragmentError(f"the session has no media section with mid {candidate.sdpMid!r}")
        await transport.addRemoteCandidate(candidate)
    if fragment.end_of_candidates:
        for transport in set(transports.values()):
            await transport.addRemoteCandidate(None)
    return len(fragment.candidates)
