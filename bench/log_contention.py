"""Appends to the SQLite log while other clients replay it (embedded mode).

    python bench/log_contention.py [--appends 1000] [--readers 2] [--events 10000]

A spectator who connects or refreshes replays the log in pages of 1,000 events. This times
single-event appends (what a decision or a tool result is) with no reader, then while `--readers`
tasks replay pages of 1,000 events without pause: reads run on a connection and thread of their
own, so the second figure should stay near the first.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_probe, summary_ms, table
from server.log.sqlite import SqliteLog

BODY = {"kind": "message", "role": "user", "chat": "main", "sender": "human:bench", "content": "x" * 300}


async def _appends(log: SqliteLog, count: int) -> list[float]:
    samples = []
    for i in range(count):
        started = time.perf_counter()
        await log.append("w", {**BODY, "content": f"append {i}"})
        samples.append(time.perf_counter() - started)
    return samples


async def measure(appends: int, readers: int, events: int, workdir: Path) -> list[list[object]]:
    log = await SqliteLog.open(workdir / "log.sqlite3")
    try:
        for start in range(0, events, 1000):
            await log.append_batch("w", [(dict(BODY), ()) for _ in range(min(1000, events - start))])
        alone = summary_ms(await _appends(log, appends))
        replaying = True
        pages = 0

        async def replay() -> None:
            nonlocal pages
            while replaying:
                await log.read("w", 0, 1000)
                pages += 1
        tasks = [asyncio.create_task(replay()) for _ in range(readers)]
        await asyncio.sleep(0.05)
        pages, started = 0, time.perf_counter()
        beside = summary_ms(await _appends(log, appends))
        rate = pages / (time.perf_counter() - started)
        replaying = False
        await asyncio.gather(*tasks)
    finally:
        await log.close()
    return [["no reader", alone[0], alone[1], "-"],
            [f"{readers} readers replaying pages of 1,000", beside[0], beside[1], f"{rate:.0f}"],
            ["ratio", beside[0] / alone[0], beside[1] / alone[1], ""]]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--events", type=int, default=10_000)
    args = parser.parse_args()
    probe = cpu_probe()
    with tempfile.TemporaryDirectory() as tmp:
        rows = await measure(args.appends, args.readers, args.events, Path(tmp))
    print(f"\nSingle-event appends to the SQLite log ({args.appends} each; a world of {args.events} events; ms)")
    print(table(["while", "p50 ms", "p99 ms", "pages read per second meanwhile"], rows))
    print(f"\nCPU probe (lower is a faster machine): {probe:.1f} ms before, {cpu_probe():.1f} ms after")


if __name__ == "__main__":
    asyncio.run(main())
