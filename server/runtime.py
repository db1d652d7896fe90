"""Process-wide settings for a long-running server."""
from __future__ import annotations

import gc
import sys


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
