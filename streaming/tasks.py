"""Background tasks end the way aiortc's do: every component keeps a reference to its task, the task handles
its own ending (expected endings quiet, an unexpected one logged once, with a traceback, by the task itself)
and stopping it never raises what the task already reported.

Session log lines carry the session id through :func:`session_log` (a :class:`logging.LoggerAdapter`): the
id is in the message (``[id] ...``) and on the record (``record.session_id``) for structured handlers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import Any

logger = logging.getLogger(__name__)


class SessionLog(logging.LoggerAdapter[logging.Logger]):
    """Prefixes each message with ``[session id]`` and puts ``session_id`` on the record."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        assert self.extra is not None
        kwargs["extra"] = {**self.extra, **kwargs.get("extra", {})}
        return f"[{self.extra['session_id']}] {msg}", kwargs


def session_log(base: logging.Logger, session_id: str) -> SessionLog:
    return SessionLog(base, {"session_id": session_id})


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has finished.

    Its cancellation is expected, not an error; an exception it ended with is its owner's to report (our
    tasks log their own failures and return), so it is not raised here: a stop always completes. One that
    escaped a task anyway is logged here, so it is never lost. The caller's own cancellation propagates.
    """
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        logger.error("task %s had failed", task.get_name(), exc_info=task.exception())
