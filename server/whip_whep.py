"""The IETF WebRTC-HTTP protocols: WHIP (RFC 9725) ingest and WHEP (draft-ietf-wish-whep) egress.

| method and path                                | what                                                   |
|------------------------------------------------|--------------------------------------------------------|
| ``POST /whip[?avatar=NAME][&size=WxH]``        | SDP offer in; ``201``, ``Location``, ``ETag``, answer  |
| ``DELETE /whip/{session_id}``                  | end the session (``200``)                              |
| ``PATCH /whip/{session_id}``                   | trickle ICE (RFC 9725 4.3.1) ``204``; ICE restart 422  |
| ``POST /whep/{session_id}[?size=WxH]``         | watch a session; ``201``, ``Location``, ``ETag``, answer |
| ``DELETE /whep/{session_id}/viewers/{viewer}`` | stop watching (``200``)                                |
| ``PATCH /whep/{session_id}/viewers/{viewer}``  | trickle ICE as for WHIP                                |
| ``OPTIONS`` on all of them                     | ``Allow`` (the resource's methods), CORS preflight     |

The endpoints' ``OPTIONS`` add ``Accept-Post: application/sdp`` and the configured ICE servers as ``Link``
headers; the resources' add ``Accept-Patch: application/trickle-ice-sdpfrag``. Every other method is ``405`` +
``Allow``. Answers are ``Content-Type: application/sdp`` exactly (no parameters).

Errors: ``415`` for a body of another media type, ``400`` for an SDP (or ICE fragment) that does not parse or
asks for what the resource cannot do, ``401`` + ``WWW-Authenticate: Bearer`` without the configured token
(every method but ``OPTIONS``), ``404`` for an unknown session, viewer or avatar, ``412`` for a PATCH whose
``If-Match`` is not the resource's ``ETag``, ``422`` for an ICE restart (aioice cannot restart a live
connection: the client starts a new session), ``503`` + ``Retry-After`` when the sessions or a session's
viewers are all taken. Every failure leaves no session, viewer or task behind.

The answers are complete (the server gathers its ICE candidates before answering), and an offer needs no
candidates at all: one with none, or with only mDNS (``.local``) names, connects through the peer-reflexive
candidates its checks bring (:mod:`lipcast.streaming.interop`), and its client may trickle the rest.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from aiortc import RTCPeerConnection, RTCSessionDescription
from multidict import CIMultiDict

from lipcast.pipeline.enhance.options import MODE_FIELD, STRENGTH_FIELD
from lipcast.server import cors
from lipcast.server.auth import require_bearer
from lipcast.server.config import IceServer
from lipcast.server.errors import (
    BadRequestError,
    NotFoundError,
    PreconditionFailedError,
    UnprocessableError,
    UnsupportedMediaTypeError,
)
from lipcast.server.offer_checks import MAX_SDP_BYTES, requested_output_size
from lipcast.server.peer import PeerEndpoint
from lipcast.server.sessions import Session
from lipcast.server.state import SETTINGS, runtime_of
from lipcast.server.viewers import Viewer
from lipcast.streaming.trickle import (
    TRICKLE_CONTENT_TYPE,
    FragmentError,
    IceRestartError,
    add_fragment,
    parse_fragment,
)
from lipcast.streaming.wire import SDP_CONTENT_TYPE

SDP_TYPE = SDP_CONTENT_TYPE
ENDPOINT_METHODS = "OPTIONS, POST"  # /whip, /whep/{session_id}
RESOURCE_METHODS = "OPTIONS, PATCH, DELETE"  # what a POST created: a WHIP session, a WHEP viewer
ICE_RESTART_REFUSED = (
    "ICE restarts are not supported (aioice cannot restart a live connection): "
    "DELETE this resource and POST a new offer"
)


async def read_body(request: web.Request, media_type: str, what: str) -> str:
    """A body that must be ``media_type`` text: 415 for another media type, 400 for one too long or not
    UTF-8."""
    if request.content_type.lower() != media_type:
        raise UnsupportedMediaTypeError(
            f"{what} must be sent as Content-Type: {media_type}, not {request.content_type!r}"
        )
    body = await request.read()
    if len(body) > MAX_SDP_BYTES:  # before decoding; validate_offer checks an offer's text too
        raise BadRequestError(f"{what} is longer than {MAX_SDP_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequestError(f"{what} is not UTF-8 text") from e


async def read_sdp_offer(request: web.Request) -> str:
    """The body of a POST that must be an SDP offer (the SDP itself is checked by server.offer_checks)."""
    return await read_body(request, SDP_TYPE, "the offer")


def ice_server_links(servers: tuple[IceServer, ...]) -> list[str]:
    """``Link`` header values for the STUN/TURN servers (RFC 9725 section 4.6)."""
    links = []
    for server in servers:
        for url in server.urls:
            link = f'<{url}>; rel="ice-server"'
            if server.username is not None:
                link += f'; username="{server.username}"'
            if server.credential is not None:
                link += f'; credential="{server.credential}"; credential-type="password"'
            links.append(link)
    return links


def ice_etag(pc: RTCPeerConnection) -> str:
    """The entity-tag of a resource's ICE session (RFC 9725 section 4.3.1): lipcast's ICE username fragment,
    which would change with an ICE restart."""
    local = pc.localDescription
    ufrag = next(
        (line.split(":", 1)[1].strip() for line in local.sdp.splitlines() if line.startswith("a=ice-ufrag:")),
        "",
    )
    return f'"{ufrag}"'


def created(request: web.Request, location: str, endpoint: PeerEndpoint) -> web.Response:
    """``201``: the answer as ``application/sdp`` (no parameters), ``Location``, ``ETag``, ICE servers."""
    headers: CIMultiDict[str] = CIMultiDict(
        {"Content-Type": SDP_TYPE, "Location": location, "ETag": ice_etag(endpoint.pc)}
    )
    for link in ice_server_links(request.app[SETTINGS].ice_servers):
        headers.add("Link", link)
    return web.Response(status=201, body=endpoint.pc.localDescription.sdp.encode(), headers=headers)


# ---- WHIP ----


async def whip_create(request: web.Request) -> web.Response:
    require_bearer(request)
    runtime = runtime_of(request)
    offer = await read_sdp_offer(request)
    avatar = request.query.get("avatar") or None
    size = requested_output_size(dict(request.query), runtime.settings.output_cap(), prefix="query ")
    enhance = runtime.sessions.enhance_choice(
        request.query.get(MODE_FIELD), request.query.get(STRENGTH_FIELD)
    )
    answer = await runtime.sessions.create(
        RTCSessionDescription(sdp=offer, type="offer"),
        avatar,
        signalling="whip",
        enhance=enhance,
        size=size,
    )
    location = request.app.router["whip-session"].url_for(session_id=answer.session_id)
    return created(request, str(location), runtime.sessions.get(answer.session_id))


def whip_session(request: web.Request) -> Session:
    session = runtime_of(request).sessions.get(request.match_info["session_id"])
    if session.signalling != "whip":
        raise NotFoundError(f"no WHIP session {session.id!r}")
    return session


# ---- WHEP ----


async def whep_create(request: web.Request) -> web.Response:
    require_bearer(request)
    runtime = runtime_of(request)
    session = runtime.sessions.get(request.match_info["session_id"])
    size = requested_output_size(dict(request.query), runtime.settings.output_cap(), prefix="query ")
    offer = await read_sdp_offer(request)
    answer = await session.viewers.add(offer, size)
    location = request.app.router["whep-viewer"].url_for(session_id=session.id, viewer_id=answer.viewer_id)
    return created(request, str(location), session.viewers.get(answer.viewer_id))


def whep_viewer(request: web.Request) -> Viewer:
    session = runtime_of(request).sessions.get(request.match_info["session_id"])
    return session.viewers.get(request.match_info["viewer_id"])


# ---- the resources a POST creates: the same methods for a WHIP session and a WHEP viewer ----


def matches(if_match: str, etag: str) -> bool:
    """Whether an ``If-Match`` list names ``etag`` (weak tags compare as RFC 9110 says If-Match must not)."""
    return etag in (tag.strip() for tag in if_match.split(","))


async def trickle(request: web.Request, endpoint: PeerEndpoint) -> web.Response:
    """PATCH with a trickle-ice-sdpfrag (RFC 9725 section 4.3): its candidates join the live connection."""
    text = await read_body(request, TRICKLE_CONTENT_TYPE, "the ICE fragment")
    if_match = request.headers.get("If-Match")
    if if_match is not None and if_match.strip() == "*":
        raise UnprocessableError(ICE_RESTART_REFUSED)  # If-Match: * is how a client asks for a restart
    try:
        fragment = parse_fragment(text)
    except FragmentError as e:
        raise BadRequestError(f"malformed ICE fragment: {e}") from e
    etag = ice_etag(endpoint.pc)
    if if_match is not None and not matches(if_match, etag):
        raise PreconditionFailedError(f"If-Match {if_match} is not this resource's ETag {etag}")
    try:
        added = await add_fragment(endpoint.pc, fragment)
    except IceRestartError as e:
        raise UnprocessableError(f"{e}: {ICE_RESTART_REFUSED}") from e
    except FragmentError as e:
        raise BadRequestError(f"cannot apply the ICE fragment: {e}") from e
    end = ", end of candidates" if fragment.end_of_candidates else ""
    endpoint.log.info("trickle: %d remote candidate(s)%s", added, end)
    return web.Response(status=204, headers={"ETag": etag})


def add_resource_methods(
    resource: web.Resource, find: Callable[[web.Request], PeerEndpoint], client: str
) -> None:
    """DELETE (close it, ``200``) and PATCH (trickle ICE, ``204``) on what ``find`` names (404 if none);
    aiohttp answers any other method ``405`` + ``Allow``."""

    async def delete(request: web.Request) -> web.Response:
        require_bearer(request)
        await find(request).close(f"deleted by {client} client")
        return web.Response(status=200)

    async def patch(request: web.Request) -> web.Response:
        require_bearer(request)
        return await trickle(request, find(request))

    resource.add_route("DELETE", delete)
    resource.add_route("PATCH", patch)


# ---- OPTIONS ----


async def options(request: web.Request) -> web.Response:
    """``Allow`` and a CORS preflight (:mod:`lipcast.server.cors`); on the endpoints also ``Accept-Post`` and
    the ICE servers (``Link``), on the resources ``Accept-Patch``. Never authenticated (RFC 9725 4.8)."""
    resource = request.match_info.route.resource
    endpoint = resource is not None and resource.name in ("whip-endpoint", "whep-endpoint")
    response = await cors.preflight(request, ENDPOINT_METHODS if endpoint else RESOURCE_METHODS)
    if endpoint:
        response.headers["Accept-Post"] = SDP_TYPE
        for link in ice_server_links(request.app[SETTINGS].ice_servers):
            response.headers.add("Link", link)
    else:
        response.headers["Accept-Patch"] = TRICKLE_CONTENT_TYPE
    return response


def setup(app: web.Application) -> None:
    """Per protocol: the endpoint that takes offers (POST) and the resource each answer names."""
    router = app.router
    whip = ("WHIP", "/whip", whip_create, "/whip/{session_id}", "whip-session", whip_session)
    whep = (
        "WHEP",
        "/whep/{session_id}",
        whep_create,
        "/whep/{session_id}/viewers/{viewer_id}",
        "whep-viewer",
        whep_viewer,
    )
    for client, endpoint_path, create, resource_path, resource_name, find in (whip, whep):
        endpoint = router.add_resource(endpoint_path, name=f"{client.lower()}-endpoint")
        endpoint.add_route("OPTIONS", options)
        endpoint.add_route("POST", create)
        resource = router.add_resource(resource_path, name=resource_name)
        resource.add_route("OPTIONS", options)
        add_resource_methods(resource, find, client)
