"""Search in a world's log at 100,000 messages, embedded (SQLite) and distributed (Redis).

    python bench/search.py [--messages 100000] [--rounds 5] [--redis redis://127.0.0.1:6379/0]

Fills one world with `--messages` messages (one in 1,000 holds the word searched for), then times, in
each mode: two baselines, a plain read of the newest 5,000 events (what a page's first render reads)
and of the whole log in pages of 1,000 (a search done in Python would read that first);
a search that finds 50 recent hits (it stops early); a search for a rare word, which looks through the
whole window; and a search for nothing that exists (the worst case: every event looked at). Neither
backend keeps a text index (server/log/search.py): SQLite runs a LIKE over the stored JSON, Redis a Lua
scan, in steps of at most 4 MiB (and 10,000 events in SQLite, 5,000 per call in Redis).
"""
from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_probe, summary_ms, table
from server.log.base import EventLog
from server.log.redis.log import RedisLog
from server.log.sqlite import SqliteLog

BATCH = 1000


def _message(i: int) -> dict[str, Any]:
    word = " kiwi" if i % 1000 == 0 else ""
    rare = " zebrafish" if i == 7 else ""
    return {"kind": "message", "role": "user", "chat": "main", "sender": "human:bench",
            "content": f"message {i}: the release notes say nothing much{word}{rare} " + "x" * 150}


async def _fill(log: EventLog, world: str, count: int) -> None:
    for start in range(0, count, BATCH):
        await log.append_batch(world, [(_message(i), ()) for i in range(start, min(count, start + BATCH))])


async def _read_all(log: EventLog, world: str) -> list[Any]:
    """What a search without the storage's help would read first: every event, a page at a time."""
    out: list[Any] = []
    while page := await log.read(world, out[-1]["seq"] if out else 0, 1000):
        out += page
    return out


async def _time(rounds: int, job: Callable[[], Awaitable[object]]) -> tuple[float, float, int]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await job()
        samples.append(time.perf_counter() - started)
    return summary_ms(samples)


async def _measure(name: str, log: EventLog, world: str, rounds: int) -> list[list[object]]:
    last = await log.last_seq(world)
    jobs: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("read newest 5,000 (baseline)", lambda: log.read(world, last - 5000, 5000)),
        ("read all, pages of 1,000 (baseline)", lambda: _read_all(log, world)),
        ("search 'kiwi' (50 hits)", lambda: log.search(world, "kiwi")),
        ("search 'zebrafish' (1 old hit)", lambda: log.search(world, "zebrafish")),
        ("search 'nowhere' (0 hits)", lambda: log.search(world, "nowhere-to-be-found")),
    ]
    rows: list[list[object]] = []
    for label, job in jobs:
        found = await job()
        p50, p99, n = await _time(rounds, job)
        rows.append([name, label, len(found) if isinstance(found, list) else "", p50, p99, n])
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    print(f"cpu probe: {cpu_probe():.1f} ms; {args.messages:,} messages in one world")
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = await SqliteLog.open(Path(tmp) / "log.sqlite3")
        try:
            await _fill(sqlite, "bench", args.messages)
            rows += await _measure("embedded (SQLite)", sqlite, "bench", args.rounds)
        finally:
            await sqlite.close()
    prefix = f"bench-search-{secrets.token_hex(4)}"
    redis_log = await RedisLog.open(args.redis, prefix)
    try:
        await _fill(redis_log, "bench", args.messages)
        rows += await _measure("distributed (Redis)", redis_log, "bench", args.rounds)
    finally:
        client = redis_log._client
        if client is not None:
            async for key in client.scan_iter(match=f"*{prefix}*", count=1000):
                await client.delete(key)
        await redis_log.close()
    print(table(["mode", "operation", "found", "p50 ms", "p99 ms", "n"], rows))


if __name__ == "__main__":
    asyncio.run(main())
