"""Bearer-token authentication (RFC 6750), as WHIP (RFC 9725 section 4.5) and WHEP require every endpoint
to support it. One shared token from the settings; none configured means the server is open.

Handlers call :func:`require_bearer` first, so an unauthenticated request learns nothing else (not even
whether a session exists). CORS preflight ``OPTIONS`` requests carry no credentials and are never checked.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from lipcast.server.errors import UnauthorizedError
from lipcast.server.state import SETTINGS


def bearer_token(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, or None."""
    scheme, _, value = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def require_bearer(request: web.Request) -> None:
    """Raise :class:`UnauthorizedError` unless the request carries the configured token (if any)."""
    expected = request.app[SETTINGS].auth_token
    if expected is None:
        return
    given = bearer_token(request)
    if given is None:
        raise UnauthorizedError("this server requires 'Authorization: Bearer <token>'")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise UnauthorizedError("the bearer token is not valid", error="invalid_token")
