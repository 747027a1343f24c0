"""Runs in a **media worker** process (``lipcast serve --media-workers N`` starts N of them).

A worker owns whole sessions: their peer connections (aioice binds their UDP ports here, so media never
passes through the front), inbound audio, VAD, jitter buffer, media clock, featurizer, encoders and WHEP
viewers. It serves the ordinary lipcast HTTP API on a Unix socket that only the front talks to, plus
``GET /_worker/state`` for the front's health checks and bookkeeping.

* :mod:`server.worker.spec` -- what the front hands a worker at spawn (shared by both processes).
* :mod:`server.worker.runtime` -- the worker's runtime: its sessions render through the front's engine
  (:class:`~pipeline.engine_link.client.SharedRenderer`) or in a CPU engine of their own.
* :mod:`server.worker.main` -- the process entry point and its signal handling.
"""
