"""A world's budget of LLM calls a minute (the `llm_calls_per_minute` setting).

Each message a person sends wakes the agents and resets the turn limit, so without a budget the calls
a world makes (and pays for) grow with how fast its members type. A token bucket per world holds a
minute's calls; each call takes one, and a call past the budget waits its turn rather than fails: the
agents slow down to the budget, and the chat says why. Counted in each server process, as the flood
limits are (docs/protocol.md §10).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

_PRUNE_AT = 1000  # buckets kept before those of quiet worlds are dropped


@dataclass
class _Bucket:
    tokens: float
    at: float  # when `tokens` was counted
    told_until: float = 0.0  # the chat was told of the wait that ends then


@dataclass(frozen=True)
class Wait:
    seconds: float  # before the call may start (0: at once)
    tell: bool  # the first wait of a run of them: say so in the chat


class LLMBudget:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def reserve(self, world: str, per_minute: int) -> Wait:
        """Take one call of `world`'s budget: how long it waits for it. Calls reserved one after another
        wait in turn (the bucket may go below zero: each reservation is a later slot)."""
        now, rate = self._clock(), per_minute / 60.0
        bucket = self._buckets.get(world)
        if bucket is None:
            if len(self._buckets) >= _PRUNE_AT:
                self._prune(now)
            bucket = self._buckets[world] = _Bucket(tokens=float(per_minute), at=now)
        bucket.tokens = min(float(per_minute), bucket.tokens + (now - bucket.at) * rate) - 1.0
        bucket.at = now
        if bucket.tokens >= 0:
            return Wait(0.0, tell=False)
        seconds = -bucket.tokens / rate
        tell = now >= bucket.told_until
        bucket.told_until = max(bucket.told_until, now + seconds)
        return Wait(seconds, tell)

    def _prune(self, now: float) -> None:
        """Drop the buckets of worlds that made no call for a minute (they are full again)."""
        self._buckets = {world: b for world, b in self._buckets.items() if now - b.at < 60.0}
