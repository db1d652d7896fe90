"""Process-wide settings for a long-running server."""
from __future__ import annotations

import gc


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
