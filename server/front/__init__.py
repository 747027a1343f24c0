"""Runs in the **front** process of ``lipcast serve --media-workers N`` (N > 1).

The front keeps aiohttp (signalling, HTTP API, static pages, metrics, auth, limits), the avatars and the one
render engine (which owns the GPU). It starts N media workers (:mod:`lipcast.server.worker`), places each new
call on the least-loaded one, and forwards everything addressed to a session to the worker that owns it.

* :mod:`lipcast.server.front.pool` -- the worker processes: start, place, route, health checks, crash and hang
  handling, drain.
* :mod:`lipcast.server.front.tier` -- the middleware that forwards session requests, and the front's own
  ``/healthz``, ``/readyz`` and ``/metrics`` (summed or labelled over all processes).
* :mod:`lipcast.server.front.promtext` -- merging the workers' Prometheus texts into one exposition.
"""
