"""The runtime of a process that takes calls, assembled in one place from one :class:`Settings`.

* :func:`build_runtime` -- the front (or the only process), and a media worker with a CPU engine of its own:
  the render side comes from :func:`lipcast.pipeline.assembly.assemble` (devices, backend, engines,
  avatars, warm-up), the settings it decided ("auto" batch sizes and render budget) are kept, and the
  sessions are built on top.
* :func:`build_linked_runtime` -- a media worker whose frames the front's engine renders: the same avatars,
  registered with the worker's end of the engine link.
"""

from __future__ import annotations

from typing import Any

from lipcast.pipeline.assembly import assemble, avatar_registry, load_avatars
from lipcast.pipeline.backend import LipSyncBackend
from lipcast.pipeline.engine_link.client import SharedRenderer
from lipcast.server.config import Settings
from lipcast.server.sessions import SessionManager
from lipcast.server.state import Runtime
from lipcast.streaming.clock import Clock


def build_runtime(settings: Settings, clock: Clock | None = None) -> Runtime:
    """Everything blocking at startup (the render side's warm-up included); the engine is not started."""
    render = assemble(settings.render_config(), clock.now if clock else None)
    settings = settings.with_overrides(
        batch_sizes=render.batch_sizes, render_budget_ms=render.render_budget_ms
    )
    sessions = SessionManager(settings, render.backend, render.engine, render.registry, clock)
    return Runtime(settings, render.backend, render.engine, render.registry, sessions, render.device_report)


def build_linked_runtime(
    settings: Settings,
    renderer: SharedRenderer,
    backend: LipSyncBackend,
    device: dict[str, Any],
    clock: Clock | None = None,
) -> Runtime:
    """A media worker's runtime when the front's engine renders: ``renderer`` is the worker's end of the link,
    ``backend`` the front's backend as the worker sees it (featurizers, no model)."""
    config = settings.render_config()
    registry = avatar_registry(
        renderer, load_avatars(config.avatar_dirs, config.default_avatar, config.builtin_hd_sizes)
    )
    sessions = SessionManager(settings, backend, renderer, registry, clock)
    return Runtime(settings, backend, renderer, registry, sessions, dict(device))
