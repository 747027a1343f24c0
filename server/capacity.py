"""The one capacity gate: sessions per server and viewers per session are admitted the same way.

A slot is held from the check until the new session or viewer is in its owner's books (or has failed), so
concurrent offers awaiting their negotiation cannot overbook. A full gate raises :class:`CapacityError`,
a ``503`` with ``Retry-After: RETRY_AFTER_S`` (the middleware makes every 503 from it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from lipcast.server.errors import CapacityError

RETRY_AFTER_S = 10  # full (or draining): when to try again
STARTING_RETRY_AFTER_S = 5  # warming up or not ready: when to try again


class CapacityGate:
    """At most ``limit`` of something: the ``in_use`` count plus slots held by admissions under way."""

    def __init__(self, limit: int, in_use: Callable[[], int], full_message: Callable[[int], str]) -> None:
        self.limit = limit
        self._in_use = in_use
        self._full_message = full_message
        self.reserved = 0

    def __len__(self) -> int:
        return self._in_use() + self.reserved

    def check(self) -> None:
        if len(self) >= self.limit:
            raise CapacityError(self._full_message(self.limit), RETRY_AFTER_S)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Check, then hold one slot for the block (the caller books what it admitted before leaving it)."""
        self.check()
        self.reserved += 1
        try:
            yield
        finally:
            self.reserved -= 1
