"""Failed-token attempts, limited per client address (a token bucket each), in this process."""
from __future__ import annotations

import math
import time
from collections import OrderedDict

BURST = 30  # failed attempts an address may make at once
REFILL_SECONDS = 2.0  # then one more every this many seconds
MAX_ADDRESSES = 10_000  # the oldest buckets are forgotten beyond this (memory stays bounded)


class FailureLimiter:
    def __init__(self, burst: int = BURST, refill_seconds: float = REFILL_SECONDS) -> None:
        self.burst = burst
        self.refill_seconds = refill_seconds
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)

    def _tokens(self, address: str, now: float) -> float:
        tokens, at = self._buckets.get(address, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) / self.refill_seconds)

    def retry_after(self, address: str) -> int:
        """Seconds until `address` may try a token again; 0 when it may now."""
        tokens = self._tokens(address, time.monotonic())
        return 0 if tokens >= 1 else max(1, math.ceil((1 - tokens) * self.refill_seconds))

    def failed(self, address: str) -> None:
        now = time.monotonic()
        self._buckets[address] = (max(0.0, self._tokens(address, now) - 1), now)
        self._buckets.move_to_end(address)
        while len(self._buckets) > MAX_ADDRESSES:
            self._buckets.popitem(last=False)
