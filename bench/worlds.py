"""Thousands of worlds cost what their work costs (issue #30): restart, memory and the list of worlds.

For each mode (embedded: SQLite; distributed: Redis) and each number of worlds, the store is filled
(idle worlds written straight through the log, as `Worlds.create` writes them, for speed; the busy 1%
through a real engine: an agent, a message, the OpenAI double's tool call, a pending approval), then a
real `agent-world serve` is started on it, stopped, and started again. Measured: the restart's time
from `Popen` to a 200 from /healthz (Python's own start included: the empty store's row is the
baseline of the same run), the server's RSS after it, the p50/p99 of `GET /api/worlds?limit=100`
pages followed through their `Link` headers, and whether every pending request is back.

    ./dev bench worlds [--sizes 1000,10000,100000] [--modes embedded,redis] [--busy 0.01]
"""
from __future__ import annotations

import argparse
import asyncio
import re
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import redis as sync_redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `./dev bench worlds` runs this file as a script

from bench.common import cpu_probe, start_server, summary_ms, table  # noqa: E402
from server import events, vocab  # noqa: E402
from server.backends import open_backends  # noqa: E402
from server.engine.actors import SYSTEM, Actor  # noqa: E402
from server.engine.engine import Engine  # noqa: E402
from server.log import Claim, EventLog, Open  # noqa: E402
from server.testing.openai_double import OpenAIDouble, Text, ToolCalls  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"
OWNER = Actor("owner", vocab.OWNER)
LIST_REQUESTS = 300  # pages fetched per measurement
PAGE = 100
CHUNK = 500  # appends in flight at once while filling a store


@dataclass
class Store:
    mode: str
    data_dir: Path
    prefix: str  # Redis only

    @property
    def redis_url(self) -> str | None:
        return REDIS_URL if self.mode == "redis" else None

    def serve_args(self) -> list[str]:
        return ["--redis-url", REDIS_URL, "--redis-prefix", self.prefix] if self.mode == "redis" else []

    def drop(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        if self.mode == "redis":
            client = sync_redis.Redis.from_url(REDIS_URL)
            for pattern in (f"{{{self.prefix}:*", f"{{{self.prefix}}}:*", f"{self.prefix}:*"):
                batch = list(client.scan_iter(match=pattern, count=10_000))
                for start in range(0, len(batch), 10_000):
                    client.unlink(*batch[start:start + 10_000])
            client.close()


async def _idle_world(log: EventLog, world: str) -> None:
    """What `Worlds.create` writes for a world (its creation and its main chat), in one append."""
    await log.append_batch(world, [
        (events.world_created(world, {}, SYSTEM.sender), [Claim("world-id"), Open(vocab.world_key())]),
        (events.chat_created({"id": "main", "title": "Main"}, SYSTEM.sender), [Open(vocab.chat_key("main"))])])


def _ask_for_a_tool(body: dict[str, Any]) -> Any:
    if body["messages"][-1]["role"] == "tool":
        return Text("done")
    return ToolCalls([(f"call_{uuid.uuid4().hex[:12]}", "shell_exec", '{"command": "true"}')])


async def fill(store: Store, idle: int, busy: int, double: OpenAIDouble) -> list[str]:
    """`idle` idle worlds and `busy` worlds with a pending request; returns the busy ones' ids."""
    log, bus = await open_backends(data_dir=store.data_dir, redis_url=store.redis_url, redis_prefix=store.prefix)
    try:
        names = [f"idle-{n:06d}" for n in range(idle)]
        for start in range(0, len(names), CHUNK):
            await asyncio.gather(*(_idle_world(log, w) for w in names[start:start + CHUNK]))
        engine = Engine(log, bus, data_dir=store.data_dir, exclusive=store.mode == "embedded")
        await engine.start()
        try:
            agent = {"name": "alice", "provider": "openai", "model": "m", "base_url": double.base_url}

            async def asked(n: int) -> str:
                world: str = (await engine.create_world(OWNER, f"busy-{n:05d}", agents=[agent]))["id"]
                await engine.post_message(world, OWNER, "run it")
                return world

            made: list[str] = []
            for start in range(0, busy, 50):
                made += await asyncio.gather(*(asked(n) for n in range(start, min(busy, start + 50))))
            deadline = time.monotonic() + 120
            for world in made:
                while not await engine.pending_approvals(world):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"no pending request in {world}")
                    await asyncio.sleep(0.05)
            return made
        finally:
            await engine.stop(grace=1)
    finally:
        await bus.disconnect()
        await log.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pages(url: str, token: str) -> Iterator[float]:
    """Seconds per `GET /api/worlds?limit=PAGE`, following the `Link` header, from the start again at the end."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        path: str | None = None
        while True:
            path = path or f"/api/worlds?limit={PAGE}"
            started = time.perf_counter()
            answer = client.get(path)
            took = time.perf_counter() - started
            answer.raise_for_status()
            link = answer.headers.get("link")
            found = re.fullmatch(r'<([^>]+)>; rel="next"', link) if link else None
            path = found.group(1) if found else None
            yield took


def pending_back(url: str, token: str, busy: list[str]) -> int:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        return sum(len(client.get(f"/api/worlds/{w}/approvals/pending").json()) for w in busy)


def measure(store: Store, token: str, double: OpenAIDouble, busy: list[str]) -> dict[str, Any]:
    proc, _ = start_server(store.data_dir, token, double.base_url, store.serve_args())  # the first start
    proc.terminate()
    proc.wait(30)
    started = time.monotonic()
    proc, url = start_server(store.data_dir, token, double.base_url, store.serve_args())
    restart = time.monotonic() - started
    try:
        rss = rss_mib(proc.pid)
        walk = pages(url, token)
        next(walk)  # the first request warms the connection
        p50, p99, _ = summary_ms([next(walk) for _ in range(LIST_REQUESTS)])
        back = pending_back(url, token, busy)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"restart": restart, "rss": rss, "p50": p50, "p99": p99, "back": back}


async def run(mode: str, size: int, busy_share: float, double: OpenAIDouble, token: str) -> list[object]:
    store = Store(mode, Path(tempfile.mkdtemp(prefix="bench-worlds-")), f"bench-{secrets.token_hex(4)}")
    try:
        busy = round(size * busy_share)
        started = time.monotonic()
        made = await fill(store, size - busy, busy, double)
        filled = time.monotonic() - started
        got = measure(store, token, double, made)
        return [mode, size, busy, f"{filled:.0f}", f"{got['restart']:.2f}", f"{got['rss']:.0f}",
                f"{got['p50']:.1f} / {got['p99']:.1f}", f"{got['back']} of {busy}"]
    finally:
        store.drop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000", help="numbers of worlds, comma-separated")
    parser.add_argument("--modes", default="embedded,redis", help="embedded, redis or both")
    parser.add_argument("--busy", type=float, default=0.01, help="the share of worlds with a pending request")
    args = parser.parse_args()
    token = secrets.token_urlsafe(32)
    double = OpenAIDouble().start()
    double.respond_with(_ask_for_a_tool)
    probe = cpu_probe()
    rows: list[list[object]] = []
    try:
        for mode in args.modes.split(","):
            rows.append(await run(mode, 0, 0, double, token))  # the baseline: Python's start, an empty store
            for size in (int(s) for s in args.sizes.split(",")):
                for share in (0.0, args.busy):
                    rows.append(await run(mode, size, share, double, token))
                    print(table(HEADERS, rows[-1:]), flush=True)
    finally:
        double.stop()
    print(f"\nWorlds (restart to healthy, RSS, a page of {PAGE} worlds; {LIST_REQUESTS} pages a row)")
    print(table(HEADERS, rows))
    print(f"\nCPU probe (a fixed pure-Python workload; lower is a faster machine): {probe:.1f} ms before, "
          f"{cpu_probe():.1f} ms after. Targets: restart ≤ 2 s and list p99 ≤ 50 ms at every size, "
          f"every pending request back.")


HEADERS = ["mode", "worlds", "pending", "fill s", "restart s", "RSS MiB", "list p50 / p99 ms", "requests back"]

if __name__ == "__main__":
    asyncio.run(main())
