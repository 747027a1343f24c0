"""Cross-origin access: which browser origins may call the API from pages of other sites.

With no ``--cors-origin`` configured, the call page's own API (``/offer``, ``/sessions``, ``/avatars``...) is
same-origin only, while WHIP and WHEP answer any origin: their clients are tools on other sites by design
(RFC 9725 section 4.8), and the bearer token, when set, still guards them. With an allowlist, exactly those
origins are allowed everywhere (``*`` allows any).
"""

from __future__ import annotations

from aiohttp import web

from lipcast.server.state import SETTINGS

OPEN_BY_DEFAULT = ("/whip", "/whep")
ALLOWED_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type, If-Match"
EXPOSED_HEADERS = "Location, Link, ETag, Retry-After, Accept-Post, Accept-Patch, WWW-Authenticate"
PREFLIGHT_MAX_AGE_S = 600


def allowed_origin(request: web.Request) -> str | None:
    """The ``Access-Control-Allow-Origin`` value for this request, or None (not allowed)."""
    origin = request.headers.get("Origin")
    allowlist = request.app[SETTINGS].cors_origins
    if allowlist:
        if "*" in allowlist:
            return "*"
        return origin if origin is not None and origin.rstrip("/") in allowlist else None
    return "*" if request.path.startswith(OPEN_BY_DEFAULT) else None


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: CORS headers on every answer (errors included) to allowed origins."""
    value = allowed_origin(request)
    if value is None:
        return
    response.headers["Access-Control-Allow-Origin"] = value
    response.headers.setdefault("Access-Control-Expose-Headers", EXPOSED_HEADERS)
    if value != "*":
        response.headers.add("Vary", "Origin")


async def preflight(request: web.Request, methods: str = ALLOWED_METHODS) -> web.Response:
    """CORS preflight and ``Allow`` (``methods``: what the resource takes); never authenticated (browsers
    send no credentials with it)."""
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Methods": methods,
            "Access-Control-Allow-Headers": ALLOWED_HEADERS,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
            "Allow": methods,
        },
    )


def setup(app: web.Application, paths: tuple[str, ...]) -> None:
    """Answer preflights on ``paths`` (WHIP/WHEP register their own) and add the headers everywhere."""
    for path in paths:
        app.router.add_route("OPTIONS", path, preflight)
    app.on_response_prepare.append(add_cors_headers)
