"""Reading a request's JSON body: 400 with a message for one that is not a JSON object."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from lipcast.server.errors import BadRequestError


async def read_json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequestError(f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object")
    return body
