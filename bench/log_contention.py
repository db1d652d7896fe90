"""Appends to the SQLite log while other clients replay it, or another world writes large bodies; and one
world's small reads while another replays (embedded mode).

    python bench/log_contention.py [--appends 1000] [--readers 2] [--events 10000] [--large 16777216]

A spectator who connects or refreshes replays the log in pages of 1,000 events. This times
single-event appends (what a decision or a tool result is) with no reader, then while `--readers`
tasks replay pages of 1,000 events without pause: reads run on a connection and thread of their
own, so the second figure should stay near the first.

Then the same appends, one every 2 ms, while another world appends a `--large`-byte event (a tool result at
the most a world keeps) every 0.3 s: written in pieces, one transaction each (server/log/sqlite_pieces.py), and, as
the baseline, each in one transaction, which holds SQLite's one writer for all of it; with the WAL's cap
at its default, and past what the run writes (no checkpoint by the writer).

Last, one world's reads by key (`get_open`: what resolving an approval reads), one every 2 ms, while
another world's `--readers` clients replay pages of 1,000 events without pause: with one reader
connection (as before sqlite_readers.py) and with the log's default number.
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
from server.log import codec, sqlite_pieces
from server.log.base import Open
from server.log.sqlite import WAL_CAP, SqliteLog
from server.log.sqlite_readers import READERS

BODY = {"kind": "message", "role": "user", "chat": "main", "sender": "human:bench", "content": "x" * 300}


async def _appends(log: SqliteLog, count: int, pause: float = 0.0) -> list[float]:
    samples = []
    for i in range(count):
        started = time.perf_counter()
        await log.append("w", {**BODY, "content": f"append {i}"})
        samples.append(time.perf_counter() - started)
        if pause:
            await asyncio.sleep(pause)
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


async def beside_large(appends: int, large: int, piece_bytes: int, wal_cap: int,
                       workdir: Path) -> list[object]:
    """The appends (one every 2 ms) while another world appends a `large`-byte event every 0.3 s: their
    p50, p99 and max (ms), how many took over 10 ms, and how many large events went meanwhile."""
    log = await SqliteLog.open(workdir / f"large-{piece_bytes}-{wal_cap}.sqlite3", piece_bytes=piece_bytes,
                               wal_cap=wal_cap)
    written = 0
    writing = True

    async def write() -> None:
        nonlocal written
        while writing:
            await log.append("big", {**BODY, "content": "y" * large})
            written += 1
            await asyncio.sleep(0.3)
    try:
        writer = asyncio.create_task(write())
        await asyncio.sleep(0.3)  # the first large event on its way
        samples = await _appends(log, appends, pause=0.002)
        writing = False
        await writer
    finally:
        await log.close()
    p50, p99 = summary_ms(samples)[:2]
    return [p50, p99, max(samples) * 1000, sum(s > 0.010 for s in samples), written]


async def reads_beside_replays(reads: int, replayers: int, events: int, readers: int, workdir: Path) -> list[object]:
    """World S's reads by key (one every 2 ms) while `replayers` clients replay world L's pages of 1,000
    events without pause, on a log with `readers` reader connections: p50, p99 and max (ms)."""
    log = await SqliteLog.open(workdir / f"reads-{readers}.sqlite3", readers=readers)
    try:
        for start in range(0, events, 1000):
            await log.append_batch("L", [(dict(BODY), ()) for _ in range(min(1000, events - start))])
        await log.append("S", dict(BODY), [Open("call:1")])
        replaying = True

        async def replay() -> None:
            while replaying:
                await log.read("L", 0, 1000)
        tasks = [asyncio.create_task(replay()) for _ in range(replayers)]
        await asyncio.sleep(0.05)
        samples = []
        for _ in range(reads):
            started = time.perf_counter()
            assert await log.get_open("S", "call:1") is not None
            samples.append(time.perf_counter() - started)
            await asyncio.sleep(0.002)
        replaying = False
        await asyncio.gather(*tasks)
    finally:
        await log.close()
    p50, p99 = summary_ms(samples)[:2]
    return [p50, p99, max(samples) * 1000]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=16 * 2**20)
    args = parser.parse_args()
    probe = cpu_probe()
    with tempfile.TemporaryDirectory() as tmp:
        rows = await measure(args.appends, args.readers, args.events, Path(tmp))
        large_rows = []
        ways = ((2 * codec.MAX_EVENT_BYTES, "in one transaction (before)"),
                (sqlite_pieces.PIECE_BYTES, f"in {sqlite_pieces.PIECE_BYTES >> 20} MiB pieces"))
        for cap, cap_name in ((WAL_CAP, f"{WAL_CAP >> 20} MiB (default)"), (2**40, "past the run")):
            for piece_bytes, written in ways:
                figures = await beside_large(args.appends, args.large, piece_bytes, cap, Path(tmp))
                large_rows.append([written, cap_name, *figures])
        read_rows = [[f"{n} (before)" if n == 1 else f"{n} (now)",
                      *await reads_beside_replays(args.appends, args.readers, args.events, n, Path(tmp))]
                     for n in (1, READERS)]
    print(f"\nSingle-event appends to the SQLite log ({args.appends} each; a world of {args.events} events; ms)")
    print(table(["while", "p50 ms", "p99 ms", "pages read per second meanwhile"], rows))
    print(f"\nThe same appends, one every 2 ms, while another world appends a {args.large:,}-byte event every 0.3 s "
          f"(ms); with the WAL's cap at its default, checkpoints that the writer finishes itself come in too")
    print(table(["each large body written", "WAL cap", "p50 ms", "p99 ms", "max ms", "over 10 ms",
                 "large events meanwhile"], large_rows))
    print(f"\nA world's reads by key, one every 2 ms, while {args.readers} clients replay another world's pages of "
          f"1,000 events (ms)")
    print(table(["reader connections", "p50 ms", "p99 ms", "max ms"], read_rows))
    print(f"\nCPU probe (lower is a faster machine): {probe:.1f} ms before, {cpu_probe():.1f} ms after")


if __name__ == "__main__":
    asyncio.run(main())
