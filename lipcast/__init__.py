"""lipcast: a streaming WebRTC lip-sync avatar server.

The one import root of the project. Its parts, each a folder at the top of the repository:

* :mod:`lipcast.server` -- aiohttp signalling, sessions, the front process and its media workers;
* :mod:`lipcast.streaming` -- aiortc media: inbound audio, jitter buffering, paced outbound tracks;
* :mod:`lipcast.pipeline` -- features, lip-sync backends, avatars, compositing, the render engine;
* :mod:`lipcast.probe` -- the measuring client (``lipcast probe``), a client of the server;
* :mod:`lipcast.integrations` -- adapters that run in someone else's process (pipecat).

Dependencies point one way: ``server -> streaming -> pipeline``; the probe and the integrations sit beside
the server and import only ``streaming`` and ``pipeline``. ``make test`` checks this with import-linter.
"""
