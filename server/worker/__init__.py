"""Runs in a **media worker** process (``lipcast serve --media-workers N`` starts N of them).

A worker owns whole sessions: their peer connections (aioice binds their UDP ports here, so media never
passes through the front), inbound audio, VAD, jitter buffer, media clock, featurizer, encoders and WHEP
viewers. It serves the ordinary lipcast HTTP API on a Unix socket that only the front talks to, plus
``GET /_worker/state`` for the front's health checks and bookkeeping.

* :mod:`lipcast.server.worker.messages` -- every message between the front and a worker (both import it).
* :mod:`lipcast.server.worker.runtime` -- the worker's runtime: its sessions render through the front's engine
  (:class:`~lipcast.pipeline.engine_link.client.SharedRenderer`) or in a CPU engine of their own.
* :mod:`lipcast.server.worker.main` -- the process entry point and its signal handling.
"""
