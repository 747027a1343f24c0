"""The link between media workers and the one render engine: shared-memory rings plus a notification pipe.

Which process runs what:

* :mod:`lipcast.pipeline.engine_link.ring` -- both sides: the shared-memory layout of one worker's link.
* :mod:`lipcast.pipeline.engine_link.client` -- a **media worker**: :class:`SharedRenderer`, the worker's
  ``Renderer`` (what its sessions submit frames to).
* :mod:`lipcast.pipeline.engine_link.bridge` -- the **engine's process** (the front): :class:`EngineBridge`
  reads a worker's requests, submits them to the :class:`~lipcast.pipeline.engine.RenderEngine` (so frames
  of every worker are batched together, with their deadlines) and writes the patches back.

Per frame only the conditioning (in) and the rendered patch (out) cross, through shared memory; the pipe
carries 5- or 17-byte notifications, never arrays.
"""
