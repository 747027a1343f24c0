"""aiortc and aioice as other WebRTC stacks expect them: DTLS with any common certificate, and ICE with the
offers that OBS (libdatachannel), GStreamer and browsers send. Targets aiortc 1.16.0 and aioice 0.13.0;
tests/streaming/test_interop.py fails if the internals patched here change.

* **DTLS roles and suites.** Answering an ``a=setup:actpass`` offer, aiortc takes the DTLS client role
  (``a=setup:active``) and, as a client, offers only ECDHE-ECDSA suites: a peer with an RSA certificate
  (GStreamer's default) finds no shared cipher. WHIP servers answer ``a=setup:passive``, so the client
  picks the suite for its own certificate (:func:`answer_dtls_as_server`); where lipcast still must be
  the client (an ``a=setup:passive`` offer), it offers ECDHE-RSA suites too (:func:`use_common_dtls_suites`).
* **Remote candidates** (:func:`use_lenient_remote_candidates`). OBS sends an offer with no candidates that
  ends with ``a=end-of-candidates``; aioice takes that literally, prunes every ICE component and gathers
  nothing, so lipcast's answer has no candidates and ICE fails at once. Browsers without a granted
  microphone offer only mDNS (``.local``) host candidates, which aioice resolves before the offer is
  applied (about 1 s, and nothing where multicast does not reach), again leaving nothing to pair. Here an
  end-of-candidates that names no candidate is ignored (the peer's checks still bring peer-reflexive
  candidates, RFC 8445 section 7.3.1.3), and ``.local`` names are resolved in the background: the answer
  never waits for them, and a name that resolves joins the checks later, like a trickled candidate.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiortc.rtcdtlstransport
import aiortc.rtcicetransport
from aioice import mdns
from aiortc import RTCIceCandidate, RTCPeerConnection, sdp

logger = logging.getLogger(__name__)

# ECDSA first (aiortc's certificate), then RSA (GStreamer's and many servers' default); forward secret only.
DTLS_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "ECDHE-ECDSA-AES128-SHA:ECDHE-RSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA:ECDHE-RSA-AES256-SHA"
)
PATCHED = "_lipcast_interop"


def use_common_dtls_suites() -> None:
    """aiortc's DTLS contexts (process-wide, once) offer RSA suites as well as ECDSA ones."""
    certificate = aiortc.rtcdtlstransport.RTCCertificate
    original = certificate._create_ssl_context
    if getattr(original, PATCHED, False):
        return

    def create_ssl_context(self: Any, srtp_profiles: Any) -> Any:
        context = original(self, srtp_profiles)
        context.set_cipher_list(DTLS_CIPHERS.encode())
        return context

    setattr(create_ssl_context, PATCHED, True)
    certificate._create_ssl_context = create_ssl_context  # type: ignore[method-assign]


def remote_dtls_setups(pc: RTCPeerConnection) -> set[str]:
    """The ``a=setup`` values of the applied remote description, as aiortc's roles (auto, client, server)."""
    remote = pc.remoteDescription
    if remote is None:
        return set()
    return {m.dtls.role for m in sdp.SessionDescription.parse(remote.sdp).media if m.dtls is not None}


def answer_dtls_as_server(pc: RTCPeerConnection) -> bool:
    """After an ``actpass`` offer is applied and before the answer is made: answer ``a=setup:passive`` (the
    offerer becomes the DTLS client). An offer that asks lipcast to be the client (``passive``) is left as
    it is. Returns whether the roles were set."""
    setups = remote_dtls_setups(pc)
    if setups != {"auto"}:
        return False
    transports = {t.receiver.transport for t in pc.getTransceivers()}
    if pc.sctp is not None:
        transports.add(pc.sctp.transport)
    changed = False
    for transport in transports:
        if getattr(transport, "_role", None) == "auto":
            transport._set_role("server")
            changed = True
    return changed


# ---- remote candidates ----

_MDNS_PENDING = "_lipcast_mdns_pending"  # the transport's background resolutions still running
_END_PENDING = "_lipcast_end_pending"  # end-of-candidates arrived while names were being resolved


def known_remote_candidates(transport: aiortc.rtcicetransport.RTCIceTransport) -> int:
    return len(transport._connection.remote_candidates)


def use_lenient_remote_candidates() -> None:
    """aiortc's ICE transports (process-wide, once): an empty end-of-candidates is ignored and ``.local``
    candidates are resolved without holding up the caller (the offer's answer, a trickle PATCH)."""
    transport_class = aiortc.rtcicetransport.RTCIceTransport
    original = transport_class.addRemoteCandidate
    if getattr(original, PATCHED, False):
        return

    async def add_remote_candidate(self: Any, candidate: RTCIceCandidate | None) -> None:
        pending: set[asyncio.Task[None]] = self.__dict__.setdefault(_MDNS_PENDING, set())
        if candidate is None:
            if pending:
                setattr(self, _END_PENDING, True)  # signalled once the names are resolved
            elif known_remote_candidates(self):
                await original(self, None)
            else:
                logger.info("remote end-of-candidates without candidates: waiting for peer-reflexive ones")
            return
        if not mdns.is_mdns_hostname(candidate.ip):
            await original(self, candidate)
            return
        task = asyncio.create_task(resolve_in_background(self, original, candidate), name="ice-mdns")
        pending.add(task)
        task.add_done_callback(pending.discard)

    setattr(add_remote_candidate, PATCHED, True)
    transport_class.addRemoteCandidate = add_remote_candidate  # type: ignore[method-assign]


async def resolve_in_background(transport: Any, add: Any, candidate: RTCIceCandidate) -> None:
    """aioice resolves the name and adds the candidate; then a deferred end-of-candidates follows."""
    try:
        await add(transport, candidate)
    except Exception as e:  # no multicast route, the connection closed meanwhile, ...
        logger.info("mDNS candidate %s not used: %s", candidate.ip, e)
    pending = getattr(transport, _MDNS_PENDING)
    pending.discard(asyncio.current_task())
    if pending or not getattr(transport, _END_PENDING, False):
        return
    setattr(transport, _END_PENDING, False)
    if known_remote_candidates(transport) and transport.state not in ("closed", "failed"):
        try:
            await add(transport, None)
        except Exception as e:
            logger.info("end-of-candidates not signalled: %s", e)


def use_interop() -> None:
    """Every adjustment of this module (process-wide, idempotent)."""
    use_common_dtls_suites()
    use_lenient_remote_candidates()
