"""A slow WebSocket reader against the default bound: how far behind it falls before it is closed.

    python bench/slow_reader.py [--seconds 120] [--rate 40] [--size 20000] [--reads 5]

A real `agent-world serve` with its default bound (1,000 frames behind, docs/protocol.md §6). The
owner posts `size`-character messages `rate` times a second into one world. Two JSON WebSocket
clients watch it from the start: a slow one that reads `reads` frames a second, and, the baseline in
the same run, one that reads as fast as it can. For each: whether and when the server closed it, with
which code and `after=N`, how many frames it had read, and how far behind the world it was then (the
events posted minus the last one it read). The server's RSS is sampled throughout.

Target: the slow reader is closed with 1013 and `after=N` within a bound behind (1,000 frames, plus
what the kernel buffers hold), with every frame up to N read; the fast reader is never closed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.common import cpu_probe, table  # noqa: E402


@dataclass
class Reader:
    name: str
    pause: float  # seconds after each frame read (0: as fast as it can)
    read: int = 0
    last_seq: int = 0
    closed_after: float | None = None  # seconds from the first post to the close
    code: int | None = None
    reason: str = ""
    behind_at_close: int | None = None
    gapless: bool = True


@dataclass
class Poster:
    posted: int = 0
    first_at: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)


def post(url: str, token: str, world: str, rate: float, size: int, poster: Poster) -> None:
    """Post messages `rate` times a second (a fixed schedule, so a slow request does not slow the rate)."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        poster.first_at = time.monotonic()
        n = 0
        while not poster.stop.is_set():
            due = poster.first_at + n / rate
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            reply = http.post(f"/api/worlds/{world}/messages", json={"content": f"{n:06d} " + "z" * size})
            reply.raise_for_status()
            n += 1
            poster.posted = n


async def read(ws: ClientConnection, reader: Reader, poster: Poster, first_seq: int) -> None:
    try:
        async for text in ws:
            frame = json.loads(text)
            if frame.get("type") == "event":
                seq = frame["event"]["seq"]
                reader.gapless = reader.gapless and (reader.last_seq == 0 or seq == reader.last_seq + 1)
                reader.last_seq, reader.read = seq, reader.read + 1
            if reader.pause:
                await asyncio.sleep(reader.pause)
    except ConnectionClosed:
        pass
    reader.code, reader.reason = ws.close_code, ws.close_reason or ""
    if not poster.stop.is_set():
        reader.closed_after = time.monotonic() - poster.first_at
        reader.behind_at_close = first_seq + poster.posted - reader.last_seq


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def run(args: argparse.Namespace) -> None:
    token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = common.start_server(Path(tmp) / "data", token, "http://127.0.0.1:9/v1")
        try:
            headers = {"Authorization": f"Bearer {token}"}
            world = httpx.post(f"{url}/api/worlds", headers=headers, json={"name": "Slow"}, timeout=30).json()["id"]
            first_seq = int(httpx.get(f"{url}/api/worlds/{world}/events?after=0", headers=headers,
                                      timeout=30).json()[-1]["seq"])
            ws_url = url.replace("http", "ws") + f"/api/worlds/{world}/ws?after={first_seq}"
            poster = Poster()
            readers = [Reader("slow", 1 / args.reads), Reader("as fast as it can", 0.0)]
            rss: list[int] = []
            # max_queue=1: the client library holds one frame, so reading slowly is felt at the server. No
            # pings of its own, as a browser: a pong queued behind megabytes would end it first (1006 at 40 s).
            sockets = [await connect(ws_url, additional_headers=headers, max_size=None, max_queue=1,
                                     ping_interval=None) for _ in readers]
            thread = threading.Thread(target=post, args=(url, token, world, args.rate, args.size, poster))
            thread.start()
            tasks = [asyncio.create_task(read(ws, r, poster, first_seq))
                     for ws, r in zip(sockets, readers, strict=True)]
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline and not tasks[0].done():
                rss.append(rss_kib(proc.pid))
                await asyncio.sleep(0.5)
            poster.stop.set()
            thread.join()
            for ws in sockets:
                await ws.close()
            await asyncio.gather(*tasks)
        finally:
            proc.terminate()
            proc.wait(10)
    print(f"CPU probe: {cpu_probe():.1f} ms ({os.cpu_count()} CPUs); load average {os.getloadavg()[0]:.2f}; "
          f"{args.rate:g} messages of {args.size:,} characters a second, for up to {args.seconds:g} s; "
          f"{poster.posted} posted")
    rows = []
    for r in readers:
        rows.append([r.name, f"{r.code}" if r.closed_after is not None else "open to the end",
                     f"{r.closed_after:.1f}" if r.closed_after is not None else "-",
                     r.reason or "-", r.read, r.behind_at_close if r.behind_at_close is not None else "-",
                     "yes" if r.gapless else "NO"])
    print(table(["reader", "closed with", "after s", "reason", "frames read", "behind at close", "gapless"], rows))
    print(f"server RSS: {min(rss) // 1024} MiB at the start, {max(rss) // 1024} MiB at most")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=40.0, help="messages posted a second")
    parser.add_argument("--size", type=int, default=20_000, help="characters a message")
    parser.add_argument("--reads", type=float, default=5.0, help="frames the slow reader reads a second")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
