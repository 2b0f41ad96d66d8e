"""Give freed heap memory back to the OS while the server is idle.

glibc's allocator keeps memory that Python freed (audio buffers of finished
streams, mostly) in its arenas, so a server's RSS stays at its busiest level
long after the load is gone. When no request and no WebSocket session has
been active for a moment, a full garbage collection frees what reference
cycles still hold (a disconnect's exception keeps its frames, and their audio
buffers, alive until then), and `malloc_trim(0)` returns the freed memory. The
trim runs in a worker thread, only when idle, and only on glibc;
`STREAMVOX_MALLOC_TRIM=0` turns it off (`ServerEnv.malloc_trim`: the server
then does not start this task).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
from collections.abc import Callable


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


async def trim_when_idle(is_idle: Callable[[], bool], interval_s: float = 2.0) -> None:
    """Every `interval_s`, if `is_idle()` now and was not at the last trim, trim the heap once."""
    trim = _malloc_trim()
    if trim is None:
        return
    trimmed = True  # nothing to give back at start-up
    while True:
        await asyncio.sleep(interval_s)
        if not is_idle():
            trimmed = False
        elif not trimmed:
            gc.collect()
            await asyncio.to_thread(trim, 0)
            trimmed = True
