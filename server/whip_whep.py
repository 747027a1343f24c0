"""The IETF WebRTC-HTTP protocols: WHIP (RFC 9725) ingest and WHEP (draft-ietf-wish-whep) egress.

| method and path                                 | what                                                   |
|-------------------------------------------------|--------------------------------------------------------|
| ``POST /whip[?avatar=NAME]``                    | SDP offer in, ``201`` + ``Location`` + SDP answer out  |
| ``DELETE /whip/{session_id}``                   | end the session (``200``)                              |
| ``PATCH /whip/{session_id}``                    | ``501``: no trickle ICE or ICE restart (RFC 9725 4.3.1) |
| ``POST /whep/{session_id}``                     | watch a session: ``201`` + ``Location`` + answer       |
| ``DELETE /whep/{session_id}/viewers/{viewer}``  | stop watching (``200``)                                |
| ``PATCH /whep/{session_id}/viewers/{viewer}``   | ``501`` as for WHIP                                    |
| ``OPTIONS`` on all of them                      | CORS preflight, ``Accept-Post: application/sdp``       |
| ``GET`` on a session or viewer resource         | ``204`` (the drafts give these resources no body)      |

Errors: ``415`` for a body that is not ``application/sdp``, ``400`` for an SDP that does not parse or asks
for what the resource cannot do, ``401`` + ``WWW-Authenticate: Bearer`` without the configured token, ``404``
for an unknown session, viewer or avatar, ``503`` + ``Retry-After`` when the sessions or a session's viewers
are all taken. Every failure leaves no session, viewer or task behind.

The answers are complete (the server gathers its ICE candidates before answering), so a client that does not
trickle needs nothing more; clients that trickle get ``501`` for their PATCH and, as RFC 9725 allows, go on
with the candidates in their offer (the server also learns peer-reflexive candidates from their checks).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from aiortc import RTCSessionDescription
from multidict import CIMultiDict

from lipcast.server import cors
from lipcast.server.auth import require_bearer
from lipcast.server.config import IceServer
from lipcast.server.errors import (
    BadRequestError,
    NotFoundError,
    NotImplementedApiError,
    UnsupportedMediaTypeError,
)
from lipcast.server.offer_checks import MAX_SDP_BYTES
from lipcast.server.peer import PeerEndpoint
from lipcast.server.sessions import Session
from lipcast.server.state import SETTINGS, runtime_of
from lipcast.server.viewers import Viewer
from lipcast.streaming.wire import SDP_CONTENT_TYPE

SDP_TYPE = SDP_CONTENT_TYPE
PATCH_NOT_SUPPORTED = "no trickle ICE or ICE restarts here (PATCH); send a fully gathered offer"


async def read_sdp_offer(request: web.Request) -> str:
    """The body of a POST that must be an SDP offer: 415 for another media type, 400 for one too long."""
    if request.content_type.lower() != SDP_TYPE:
        raise UnsupportedMediaTypeError(
            f"the offer must be sent as Content-Type: {SDP_TYPE}, not {request.content_type!r}"
        )
    body = await request.read()
    if len(body) > MAX_SDP_BYTES:  # before decoding; validate_offer checks the text's length too
        raise BadRequestError(f"the SDP offer is longer than {MAX_SDP_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequestError("the SDP offer is not UTF-8 text") from e
    return text  # the SDP itself is checked by server.offer_checks


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


def created(request: web.Request, location: str, answer_sdp: str) -> web.Response:
    headers: CIMultiDict[str] = CIMultiDict(Location=location)
    for link in ice_server_links(request.app[SETTINGS].ice_servers):
        headers.add("Link", link)
    return web.Response(status=201, text=answer_sdp, content_type=SDP_TYPE, headers=headers)


# ---- WHIP ----


async def whip_create(request: web.Request) -> web.Response:
    require_bearer(request)
    runtime = runtime_of(request)
    offer = await read_sdp_offer(request)
    avatar = request.query.get("avatar") or None
    answer = await runtime.sessions.create(
        RTCSessionDescription(sdp=offer, type="offer"), avatar, signalling="whip"
    )
    location = request.app.router["whip-session"].url_for(session_id=answer.session_id)
    return created(request, str(location), answer.sdp)


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
    offer = await read_sdp_offer(request)
    answer = await session.viewers.add(offer)
    location = request.app.router["whep-viewer"].url_for(session_id=session.id, viewer_id=answer.viewer_id)
    return created(request, str(location), answer.sdp)


def whep_viewer(request: web.Request) -> Viewer:
    session = runtime_of(request).sessions.get(request.match_info["session_id"])
    return session.viewers.get(request.match_info["viewer_id"])


# ---- the resources a POST creates: the same three methods for a WHIP session and a WHEP viewer ----


def add_resource_methods(
    resource: web.Resource, find: Callable[[web.Request], PeerEndpoint], client: str
) -> None:
    """GET (``204``), DELETE (close it, ``200``) and PATCH (``501``) on what ``find`` names (404 if none)."""

    async def get(request: web.Request) -> web.Response:
        require_bearer(request)
        find(request)
        return web.Response(status=204)

    async def delete(request: web.Request) -> web.Response:
        require_bearer(request)
        await find(request).close(f"deleted by {client} client")
        return web.Response(status=200)

    async def patch(request: web.Request) -> web.Response:
        require_bearer(request)
        find(request)
        raise NotImplementedApiError(PATCH_NOT_SUPPORTED)

    resource.add_route("GET", get)
    resource.add_route("DELETE", delete)
    resource.add_route("PATCH", patch)


# ---- CORS ----


async def preflight(request: web.Request) -> web.Response:
    """CORS preflight (:mod:`lipcast.server.cors`), plus ``Accept-Post`` on the endpoints that take offers."""
    response = await cors.preflight(request)
    resource = request.match_info.route.resource
    if resource is not None and resource.name in ("whip-endpoint", "whep-endpoint"):
        response.headers["Accept-Post"] = SDP_TYPE
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
        endpoint.add_route("OPTIONS", preflight)
        endpoint.add_route("POST", create)
        resource = router.add_resource(resource_path, name=resource_name)
        resource.add_route("OPTIONS", preflight)
        add_resource_methods(resource, find, client)
