"""Error types raised by handlers and sessions; only the middleware turns them into HTTP answers."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def headers(self) -> dict[str, str]:
        return {}

    def body(self) -> dict[str, object]:
        return {"error": self.message}


class BadRequestError(ApiError):
    status = 400


class UnauthorizedError(ApiError):
    """Missing or wrong bearer token (RFC 6750): 401 with a ``WWW-Authenticate: Bearer`` challenge."""

    status = 401

    def __init__(self, message: str, error: str | None = None) -> None:
        super().__init__(message)
        self.error = error  # RFC 6750 error code, e.g. "invalid_token"; None when no token was sent

    def headers(self) -> dict[str, str]:
        challenge = 'Bearer realm="lipcast"'
        if self.error is not None:
            challenge += f', error="{self.error}"'
        return {"WWW-Authenticate": challenge}


class ForbiddenError(ApiError):
    status = 403


class NotFoundError(ApiError):
    status = 404


class ConflictError(ApiError):
    status = 409


class PreconditionFailedError(ApiError):
    """A conditional request (``If-Match``) whose condition does not hold."""

    status = 412


class PayloadTooLargeError(ApiError):
    status = 413


class UnsupportedMediaTypeError(ApiError):
    status = 415


class UnprocessableError(ApiError):
    status = 422


class NotImplementedApiError(ApiError):
    """A method this server knows of but does not implement for any purpose (e.g. WHIP trickle ICE)."""

    status = 501


class ServiceUnavailableError(ApiError):
    """Not now: warming up, draining, or full. A 503 with ``Retry-After``; ``details`` join the JSON body
    (``/readyz`` puts its readiness report there). The one way this server answers 503."""

    status = 503

    def __init__(self, message: str, retry_after_s: int, details: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.details = details or {}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}

    def body(self) -> dict[str, object]:
        return {**super().body(), **self.details}


class CapacityError(ServiceUnavailableError):
    """No room for another session (or viewer) right now."""


def json_error(
    status: int, message: str, headers: dict[str, str] | None = None, body: dict[str, object] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(body if body is not None else {"error": message}),
        content_type="application/json",
        headers=headers,
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map :class:`ApiError` and aiohttp's HTTP errors to JSON bodies; log anything unexpected."""
    try:
        return await handler(request)
    except ApiError as e:
        return json_error(e.status, e.message, e.headers(), e.body())
    except web.HTTPException as e:
        if e.status < 400:
            raise
        headers = {k: v for k, v in e.headers.items() if k.lower() not in ("content-type", "content-length")}
        message = e.reason
        if isinstance(e, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(e.allowed_methods))
            message = f"{request.method} is not allowed on {request.path}; allowed: {allowed}"
        return json_error(e.status, message, headers)
    except Exception:
        logger.exception("unhandled error in %s %s", request.method, request.path)
        return json_error(500, "internal server error")
