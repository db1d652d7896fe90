"""Process-wide settings for a long-running server."""
from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from typing import NamedTuple

# glibc's mallopt options (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_KEPT_FREE = 128 * 1024 * 1024  # bytes of freed memory the allocator may keep for reuse
_MAPPED_ABOVE = 32 * 1024 * 1024  # the most glibc allows: larger blocks are mapped, and unmapped when freed


def tune_gc() -> None:
    """Keep the cyclic garbage collector off the latency path.

    Almost every object here is freed by reference counting. What the collector adds is full
    scans of every live object — the imported libraries included — each costing 100 ms on a
    busy heap (bench/approvals.py saw p99 lookups of 120 ms). So: move what startup created out
    of the collector's sight (`freeze`), and collect young objects less often.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def tune_threads() -> float:
    """Give the GIL back to the event loop sooner.

    The loop shares the GIL with the server's helper threads (SQLite's, the worker pool's feeders, which
    pickle what goes to and from the workers). Each time the loop releases it for a system call (a stat,
    a send), it waits for a thread that runs Python to let go of it, after the switch interval: 5 ms by
    default. Starting a sandbox makes dozens of such calls; while a 16 MiB result went to a worker, that
    held the loop 85 ms (bench/isolation.py, a stack watcher). The loop's tasks are short; the threads'
    work is not urgent: 1 ms. Returns the interval it replaced, for the server's stop to put back.
    """
    replaced = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    return replaced


def tune_allocator() -> bool:
    """Let the C allocator reuse the memory of large objects, instead of mapping fresh pages for each.

    A 16 MiB tool result is copied whole several times in this process (read back from a worker, made a
    `str`, encoded for the sockets and the log). By default glibc maps each such block anew and unmaps it
    when freed, so each copy first faults in 4,096 fresh pages while it holds the GIL: 9-55 ms a copy on
    these machines (bench/isolation.py, getrusage in the server), and the loop, every world, waited. With
    blocks up to 32 MiB taken from one heap, the next copy finds warm pages: 2-4 ms. One arena, so that
    what one thread frees another reuses (the GIL serializes this process's Python anyway; the SQLite
    threads share its lock for their short calls). The cost is memory: the heap gives back what is free
    at its top only past 128 MiB, and nothing below a block still in use, so after a large result the
    process may stay that much larger than what it uses. Call it before any thread starts (each would get
    an arena of its own). Returns whether it applied: only on glibc, and not where the operator tuned the
    allocator through its environment variables.
    """
    global _heap
    if not _glibc():
        return False
    if any(name.startswith(("MALLOC_", "GLIBC_TUNABLES")) for name in os.environ):
        return False
    try:
        import ctypes  # (here: a Python built without it still serves)
        libc = ctypes.CDLL(None)
        mallopt, malloc, free = libc.mallopt, libc.malloc, libc.free
    except (ImportError, OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    malloc.argtypes, malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    free.argtypes, free.restype = [ctypes.c_void_p], None
    settings = ((_M_MMAP_THRESHOLD, _MAPPED_ABOVE), (_M_TRIM_THRESHOLD, _KEPT_FREE), (_M_ARENA_MAX, 1))
    if not all([mallopt(option, value) == 1 for option, value in settings]):
        return False
    _heap = _Heap(malloc, free, ctypes.memset)
    return True


class _Heap(NamedTuple):
    """glibc's malloc, free and memset, called through ctypes: with the GIL released."""
    malloc: Callable[[int], int | None]
    free: Callable[[int | None], None]
    memset: Callable[[int, int, int], object]


_heap: _Heap | None = None  # set once tune_allocator applied
_WARM_STEP = 16 * 1024 * 1024  # under _MAPPED_ABOVE: blocks from the heap, which free gives back to it


def warm_heap(size: int) -> None:
    """Fault in `size` bytes of the heap with the GIL released, and leave them free for the next blocks.

    Called in a thread before it makes large objects: a fresh page faulted in while the thread holds the
    GIL stalls the event loop too, and on these machines (virtual ones) a fault costs about 15 µs: reading
    back a worker's 16 MiB answer faulted 4,096-8,192 pages for 60-70 ms, a 40 MB one 14,600 for 220 ms
    (getrusage around each, in bench/isolation.py). Warmed first, the same reads took 4-15 ms. Does
    nothing unless tune_allocator applied (it keeps such blocks in one heap, and freed ones there). At
    most half of what the heap keeps free is warmed: past that, freeing it would give it all back. Only
    objects between pymalloc's (512 bytes) and a mapped block's (32 MiB) sizes land there; the rest of
    what is warmed stays in the heap, free, for the next.
    """
    heap = _heap
    if heap is None:
        return
    size = min(size, _KEPT_FREE // 2)
    blocks = []
    try:
        while size > 0:
            step = min(size, _WARM_STEP)
            block = heap.malloc(step)
            if not block:  # refused (the address space, or a strict overcommit policy): nothing more to warm
                break
            blocks.append(block)
            heap.memset(block, 0, step)
            size -= step
    finally:
        for block in blocks:
            heap.free(block)


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # no confstr, or no such name: not glibc
        return False
