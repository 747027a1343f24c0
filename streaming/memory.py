"""Per-frame buffers come from the heap, not from fresh pages (glibc's ``mallopt``; a no-op elsewhere).

A media worker allocates and frees several buffers of 150 KB - 1.2 MB per frame and call (composed
pictures, their yuv420p planes, PyAV frames, the conversion's temporaries). Above glibc's mmap threshold
(128 KB, raised on its own only as far as the largest block freed so far) each is a fresh ``mmap``: every
page faults in zeroed on first touch and is unmapped again on ``free``; what stays in the heap is trimmed
and regrown as the top of the heap moves. Measured on media workers with one call each (2-core box, two
workers): 11.4-11.5 ms of CPU per frame sent without this, 10.0-10.7 ms with it (two runs). The cost is
memory kept for reuse: the heap holds on to up to ``TRIM_THRESHOLD_BYTES`` of freed space.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 4 << 20  # above a 640x640 RGB picture as float32 (4.7 MB would not be: rare)
TRIM_THRESHOLD_BYTES = 64 << 20


def keep_frame_buffers_in_heap() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not done:
        logger.warning("mallopt refused the frame buffer thresholds")
    return done
