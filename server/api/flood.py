"""Flood control per person and world: one token bucket that a person's WebSocket frames and HTTP writes
in a world share (every socket and every write draws from the same one), in this process.

A socket that floods is closed with 1008 (live/stream.py); an HTTP write over the limit is refused with 429
`too_many_requests` and `Retry-After` (api/http.py). The owner's sockets are limited like everyone's; the
owner's HTTP writes are not (api/http.py says why). Searches and exports draw from a second, smaller set of
buckets (`AppContext.searches`), likewise not the owner's.
"""
from __future__ import annotations

import math
from collections import OrderedDict

from .live.json_frames import TokenBucket

RATE, BURST = 20.0, 60.0  # frames and writes: 20 a second sustained, bursts of 60
# Searches and exports (api/find.py) have a bucket of their own, per person and world: each one looks through
# up to 200,000 events inside the storage, so a few a second is plenty for a person and bounds what one costs.
SEARCH_RATE, SEARCH_BURST = 2.0, 10.0
MAX_BUCKETS = 10_000  # the least recently used are forgotten beyond this (memory stays bounded)


class Floods:
    def __init__(self, rate: float = RATE, burst: float = BURST) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: OrderedDict[tuple[str, str], TokenBucket] = OrderedDict()

    def bucket(self, world: str, person: str) -> TokenBucket:
        """`person`'s bucket in `world` (Actor.identity: the same for all their sockets and sessions)."""
        key = (world, person)
        found = self._buckets.get(key)
        if found is None:
            found = self._buckets[key] = TokenBucket(self.rate, self.burst)
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(key)
        return found

    def retry_after(self, world: str, person: str) -> int:
        """Take one write from the bucket: 0 when it was there, else whole seconds until one will be."""
        bucket = self.bucket(world, person)
        return 0 if bucket.take() else max(1, math.ceil(bucket.wait()))
