"""Events through Redis between two processes: appended to the log and published by one, delivered to the other.

    python bench/bus.py [--events 50000] [--worlds 8] [--concurrency 64] [--batch 1] [--redis-url URL]

The writer (this process) appends chat messages the way the engine does (`Store.append`: one Lua
append with a tag, then the event published on the world's channel), from `concurrency` tasks
over `worlds` worlds (`--batch N`: N events per append, all or nothing, as an LLM reply is written
with what its tool calls became). The reader (a second process) subscribes to those worlds' channels through
the server's own bus and stamps every delivery. Reported: events per second appended, events
per second delivered (first append started -> last delivery), each event's latency, and the CPU
each side and Redis spent per event (on a shared machine, the figure that says where the time goes).
The load is concurrent on purpose, as on a busy server (many agents and people writing to many
worlds at once): the log and the bus gather what is queued meanwhile into few round trips, which
one task appending one event at a time would not exercise.
Beside it, in the same run, `redis-benchmark` on the same Redis: PUBLISH, with and without
pipelining, and EVAL of a one-key INCR script (the floor of one scripted append per round trip).
Target: >= 20,000 events/s delivered.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_probe, summary_ms, table  # noqa: E402
from server.backends import open_backends  # noqa: E402
from server.engine.store import Store, channel  # noqa: E402
from server.log import Tag  # noqa: E402

TARGET = 20_000


# What the reader sends back: its latencies, first and last arrival, and its CPU time.
Report = tuple[list[float], float, float, float]


def reader(redis_url: str, prefix: str, worlds: list[str], total: int, ready: mp.Queue[str],
           results: mp.Queue[Report]) -> None:
    """The other process: subscribe to every world's channel, stamp each event as it arrives."""
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            log, bus = await open_backends(data_dir=Path(tmp), redis_url=redis_url, redis_prefix=prefix)
            try:
                latencies: list[float] = []
                first = last = 0.0
                done = asyncio.Event()

                async def follow(world: str, subscribed: asyncio.Event) -> None:
                    nonlocal first, last
                    async with bus.subscribe(channel(world), maxsize=total + 10) as sub:
                        subscribed.set()
                        async for text in sub:
                            now = time.time()
                            # orjson, as the server's own decoding: the stamp is not what is measured
                            sent = float(orjson.loads(text)["event"]["content"])
                            latencies.append(now - sent)
                            first = first or now
                            last = now
                            if len(latencies) == total:
                                done.set()
                flags = [asyncio.Event() for _ in worlds]
                tasks = [asyncio.create_task(follow(w, f)) for w, f in zip(worlds, flags, strict=True)]
                for flag in flags:
                    await flag.wait()
                ready.put("ready")
                await done.wait()
                results.put((latencies, first, last, time.process_time()))
                for task in tasks:
                    task.cancel()
            finally:
                await bus.disconnect()
                await log.close()
    asyncio.run(main())


async def write(redis_url: str, prefix: str, worlds: list[str], total: int, concurrency: int,
                batch: int) -> tuple[float, float, float]:
    """Append `total` messages from `concurrency` tasks, `batch` per append; (first start, last append done,
    CPU seconds spent meanwhile)."""
    with tempfile.TemporaryDirectory() as tmp:
        log, bus = await open_backends(data_dir=Path(tmp), redis_url=redis_url, redis_prefix=prefix)
        store = Store(log, bus)
        counter = iter(range(0, total, batch))
        try:
            async def worker() -> None:
                for n in counter:
                    world = worlds[n % len(worlds)]
                    await store.append_batch(world, [
                        ({"kind": "message", "role": "user", "chat": "main", "sender": "human:bench",
                          "content": f"{time.time():.6f}"}, [Tag("chat:main")]) for _ in range(min(batch, total - n))])
            started, cpu = time.time(), time.process_time()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return started, time.time(), time.process_time() - cpu
        finally:
            await bus.disconnect()
            await log.close()


def redis_benchmark(redis_url: str, requests: int) -> list[tuple[str, float]]:
    """(what, requests/s) from redis-benchmark against the same Redis, or nothing if it is not installed."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        print("redis-benchmark is not installed (Debian: redis-tools): no baseline", file=sys.stderr)
        return []
    parts = urlsplit(redis_url)
    base = [binary, "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379), "-q", "-n", str(requests),
            "-c", "50"]
    runs = [("PUBLISH", [], ["PUBLISH", "bench-bus", "x" * 180]),
            ("PUBLISH, pipelined by 16", ["-P", "16"], ["PUBLISH", "bench-bus", "x" * 180]),
            ("EVAL of a one-key INCR", [], ["EVAL", "return redis.call('INCR', KEYS[1])", "1", "bench-bus-n"])]
    out = []
    for name, options, command in runs:
        done = subprocess.run([*base, *options, *command], capture_output=True, text=True, timeout=300)
        found = re.findall(r"([\d.]+) requests per second", done.stdout.replace("\r", "\n"))
        if found:
            out.append((f"redis-benchmark: {name}", float(found[-1])))
    redis.Redis.from_url(redis_url).delete("bench-bus-n")
    return out


def server_cpu(redis_url: str) -> float:
    """CPU seconds the Redis server has used so far."""
    client = redis.Redis.from_url(redis_url)
    try:
        info = client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--worlds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1, help="events per append (append_batch)")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    prefix = f"awbench-{secrets.token_hex(6)}"
    worlds = [f"bus-{n}" for n in range(args.worlds)]
    print(f"CPU probe: {cpu_probe():.1f} ms ({os.cpu_count()} CPUs); {args.events} events over {args.worlds} "
          f"worlds from {args.concurrency} tasks, {args.batch} per append")
    ready: mp.Queue[str] = mp.Queue()
    results: mp.Queue[Report] = mp.Queue()
    other = mp.Process(target=reader, args=(args.redis_url, prefix, worlds, args.events, ready, results), daemon=True)
    other.start()
    try:
        ready.get(timeout=60)
        redis_cpu = server_cpu(args.redis_url)
        started, appended, writer_cpu = asyncio.run(write(args.redis_url, prefix, worlds, args.events, args.concurrency,
                                                args.batch))
        latencies, _, last, reader_cpu = results.get(timeout=300)
        redis_cpu = server_cpu(args.redis_url) - redis_cpu
        other.join(30)
    finally:
        client = redis.Redis.from_url(args.redis_url)
        for pattern in (f"{{{prefix}:*", f"{{{prefix}}}:*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)
        client.close()
    baseline = redis_benchmark(args.redis_url, 100_000)
    p50, p99, count = summary_ms(latencies)
    delivered = count / (last - started)
    appended_rate = args.events / (appended - started)
    rows: list[list[Any]] = [["agent-world: appended (Lua append + publish)", f"{appended_rate:,.0f}", ""],
                             ["agent-world: delivered to the other process", f"{delivered:,.0f}",
                              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms"]]
    rows += [[name, f"{rate:,.0f}", ""] for name, rate in baseline]
    print("\n" + table(["", "per second", "latency"], rows))
    per = 1e6 / args.events
    print(f"\nCPU per event: writer {writer_cpu * per:.0f} µs, reader {reader_cpu * per:.0f} µs "
          f"(its whole life), Redis {redis_cpu * per:.0f} µs")
    print(f"\ntarget (>= {TARGET:,} events/s delivered): {'met' if delivered >= TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
