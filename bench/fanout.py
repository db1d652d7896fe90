"""Fan-out benchmark of the JSON WebSocket: chunk latency to many spectators, and memory per idle connection.

    python bench/fanout.py [--clients 500] [--rate 100] [--seconds 10] [--idle 2000]
                           [--distributed 2000] [--redis-url redis://127.0.0.1:6379/0]

1. Starts `agent-world serve` on a loopback port (temp data folder) and a tiny OpenAI-compatible streamer whose
   text deltas are the time they were sent; one agent streams `rate` deltas a second for `seconds`.
   `clients` spectators (in separate processes, on the lean client of wsclient.py, so that the load generator
   leaves the CPU to the servers) record, for every delta, received - sent (a chunk frame may carry several
   deltas: the server joins those of one 40 ms interval).
2. Baselines: a bare `websockets` server broadcasting the same deltas to as many clients, joined as ours (the
   deltas of one 40 ms interval in one frame: the floor at our frame rate) and one frame per delta. Every delta,
   ours and theirs, is stamped with the time it was due, so a server that cannot keep up shows it as latency.
3. Memory: RSS of the server process before and after `idle` idle connections, divided by `idle`.
4. Distributed: two `agent-world serve` processes on one Redis, `distributed` spectators split evenly
   between them, the same agent streaming (so half the clients get every chunk through Redis), and the
   bare `websockets` broadcast, joined as ours, to as many clients as its baseline, in the same run (0 skips it).
Targets: p99 <= 100 ms and within 2x of each baseline; <= 64 KiB per idle connection; distributed:
p99 <= 150 ms and within 2x of its baseline.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
from websockets.asyncio.server import broadcast, serve

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import wsclient  # noqa: E402
from bench.common import free_port  # noqa: E402
from bench.common import start_server as start_server_at  # noqa: E402
from server.engine.turns.chunks import CHUNK_INTERVAL  # noqa: E402

PER_PROCESS = 250  # client connections per client process
COMPRESSION = os.environ.get("BENCH_COMPRESSION", "deflate") != "none"  # browsers negotiate permessage-deflate


def raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# -- an OpenAI-compatible streamer whose deltas are timestamps ------------------------------------------------
class Streamer:
    """Answers every chat completion with `rate` deltas a second for `seconds`, each `"<time it was due> "`.

    Each ends in white space: the server streams text out up to its last white space (redaction)."""

    def __init__(self, rate: float, seconds: float) -> None:
        self.rate, self.seconds = rate, seconds
        self.port = free_port()
        self._ready = threading.Event()
        threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True).start()
        self._ready.wait(5)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        length = int(next((line.split(":", 1)[1] for line in head.split("\r\n") if line.startswith("content-length:")),
                          "0"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n")

        async def event(data: str) -> None:
            payload = f"data: {data}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            await writer.drain()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return json.dumps({"id": "bench", "object": "chat.completion.chunk", "created": 0, "model": "m",
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        await event(chunk({"role": "assistant", "content": ""}))
        start, wall = time.monotonic(), time.time()
        for n in range(int(self.rate * self.seconds)):
            await asyncio.sleep(max(0.0, start + n / self.rate - time.monotonic()))
            await event(chunk({"content": f"{wall + n / self.rate:.6f} "}))  # when it was due, as the baseline's
        await event(chunk({}, "stop"))
        await event("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()


# -- client processes -------------------------------------------------------------------------------------------
def client_process(url: str, headers: dict[str, str], count: int, ready: Any, results: Any, idle: bool) -> None:
    """`count` connections: record chunk latencies until the stream ends (or, idle, just stay connected)."""
    raise_fd_limit()

    async def one(latencies: list[float], done: asyncio.Event, opened: list[int]) -> None:
        try:
            await follow(latencies, done, opened)
        except Exception as exc:  # a refused or dropped connection: counted and shown, not a hang
            opened.append(0)
            print(f"a client connection failed: {exc!r}", file=sys.stderr)

    async def follow(latencies: list[float], done: asyncio.Event, opened: list[int]) -> None:
        def on_message(now: float, message: bytes) -> bool:
            frame = orjson.loads(message)
            if frame["type"] == "chunk" and frame["delta"]:
                # a frame may carry several deltas (the server joins those of one short interval)
                latencies.extend(now - float(sent) for sent in frame["delta"].split())
            elif frame["type"] == "done" or (frame["type"] == "event" and frame["event"].get("role") == "assistant"):
                return False
            return not done.is_set()

        connection = await wsclient.connect(url, headers, on_message, compress=COMPRESSION)
        opened.append(1)
        if idle:
            await done.wait()
            connection.close()
        await connection.closed

    async def main() -> None:
        latencies: list[float] = []
        done = asyncio.Event()
        opened: list[int] = []
        tasks = []
        for _ in range(count):  # open gradually: the listen backlog is finite
            tasks.append(asyncio.create_task(one(latencies, done, opened)))
            await asyncio.sleep(0.002)
        while len(opened) < count:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # replay and snapshot delivered
        ready.put(count)
        if idle:
            await asyncio.get_running_loop().run_in_executor(None, results.get)  # wait for "stop"
            done.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not idle:
            results.put(latencies)
    asyncio.run(main())


def run_clients(url: str, headers: dict[str, str], clients: int, idle: bool = False
                ) -> tuple[list[mp.Process], Any, Any]:
    ready: mp.Queue[int] = mp.Queue()
    results: mp.Queue[Any] = mp.Queue()  # latencies out, "stop" in
    procs = []
    for start in range(0, clients, PER_PROCESS):
        n = min(PER_PROCESS, clients - start)
        p = mp.Process(target=client_process, args=(url, headers, n, ready, results, idle), daemon=True)
        p.start()
        procs.append(p)
    opened = 0
    while opened < clients:
        opened += ready.get(timeout=120)
    return procs, ready, results


class Unfinished(Exception):
    """Clients still waiting for the end of the stream after `COLLECT_TIMEOUT` seconds."""


COLLECT_TIMEOUT = 120.0


def collect(procs: list[mp.Process], results: Any) -> list[float]:
    latencies: list[float] = []
    for done in range(len(procs)):
        try:
            latencies.extend(results.get(timeout=COLLECT_TIMEOUT))
        except queue.Empty:
            for p in procs:
                p.terminate()
            raise Unfinished(f"{len(procs) - done} of {len(procs)} client processes had not seen the end of "
                             f"the stream {COLLECT_TIMEOUT:g} s after the last one reported") from None
    for p in procs:
        p.join(10)
    return latencies


def summary(latencies: list[float]) -> tuple[float, float, int]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000, len(ordered)


# -- the baseline: a bare websockets broadcast server -----------------------------------------------------------
def baseline_server(port: int, clients: int, rate: float, seconds: float, join: float) -> None:
    raise_fd_limit()

    async def main() -> None:
        connections: set[Any] = set()

        async def handler(ws: Any) -> None:
            connections.add(ws)
            try:
                await ws.wait_closed()
            finally:
                connections.discard(ws)
        async with serve(handler, "127.0.0.1", port, max_size=None):
            # Every client, or as many as connected in 90 s: one that failed to connect is not waited for
            # (its process reports it; the deltas column then shows fewer).
            deadline = time.monotonic() + 90
            while len(connections) < clients and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            start, wall = time.monotonic(), time.time()
            held: list[str] = []
            sent_at = float("-inf")

            def send() -> float:
                broadcast(connections, json.dumps({"type": "chunk", "agent": "streamer", "chat": "main",
                                                   "message_id": "msg_bench", "delta": " ".join(held) + " "},
                                                  separators=(",", ":")))
                held.clear()
                return time.monotonic()
            for n in range(int(rate * seconds)):
                due = start + n / rate
                if held and sent_at + join < due:  # the held deltas' frame falls due before the next delta
                    await asyncio.sleep(max(0.0, sent_at + join - time.monotonic()))
                    sent_at = send()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                # Stamped with the time the delta was due, as the streamer stamps ours: a server that falls
                # behind the rate shows it as latency, not as a slower stream.
                held.append(f"{wall + n / rate:.6f}")
                if time.monotonic() - sent_at >= join:  # as our server: the first at once, then one frame per `join`
                    sent_at = send()
            if held:
                send()
            broadcast(connections, '{"type":"done"}')
            await asyncio.sleep(2)
    asyncio.run(main())


# -- the run -------------------------------------------------------------------------------------------------
def start_server(data_dir: Path, streamer: Streamer, token: str,
                 extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], str]:
    logs = os.environ.get("FANOUT_SERVER_LOGS")  # a folder: each server's log goes there
    stderr = open(Path(logs) / f"{data_dir.name}.log", "wb") if logs else subprocess.DEVNULL
    return start_server_at(data_dir, token, streamer.base_url, extra, stderr)


def baseline(clients: int, rate: float, seconds: float, join: float = 0.0) -> tuple[float, float, int]:
    """The bare `websockets` broadcast to `clients` clients: a frame per delta, or with `join`, the deltas
    of one such interval in one frame, as our server sends them."""
    port = free_port()
    base = mp.Process(target=baseline_server, args=(port, clients, rate, seconds, join), daemon=True)
    base.start()
    time.sleep(0.5)
    procs, _, results = run_clients(f"ws://127.0.0.1:{port}/", {}, clients)
    theirs = summary(collect(procs, results))
    base.join(10)
    return theirs


def run_distributed(clients: int, rate: float, seconds: float, redis_url: str) -> tuple[float, float, int]:
    """`clients` spectators split over two servers on one Redis while an agent streams on one of them."""
    import redis

    streamer = Streamer(rate, seconds)
    token = secrets.token_urlsafe(32)
    prefix = f"awbench-{secrets.token_hex(6)}"
    extra = ("--redis-url", redis_url, "--redis-prefix", prefix)
    servers: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            urls = []
            for name in ("a", "b"):
                proc, url = start_server(Path(tmp) / name, streamer, token, extra)
                servers.append(proc)
                urls.append(url)
            owner = httpx.Client(base_url=urls[0], headers={"Authorization": f"Bearer {token}"}, timeout=30)
            world = owner.post("/api/worlds", json={"name": "Bench"}).json()["id"]
            owner.post(f"/api/worlds/{world}/agents", json={"name": "streamer", "provider": "openai", "model": "m",
                                                          "base_url": streamer.base_url}).raise_for_status()
            spectator = owner.post(f"/api/worlds/{world}/invites", json={"role": "spectator"}).json()["token"]
            headers = {"Authorization": f"Bearer {spectator}"}
            groups = [run_clients(f"ws{url[4:]}/api/worlds/{world}/ws?after=1000000", headers, share)
                      for url, share in zip(urls, (clients // 2, clients - clients // 2), strict=True)]
            owner.post(f"/api/worlds/{world}/messages", json={"content": "stream, please"}).raise_for_status()
            return summary([x for procs, _, results in groups for x in collect(procs, results)])
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            proc.wait(20)
        client = redis.Redis.from_url(redis_url)
        for pattern in (f"{{{prefix}:*", f"{{{prefix}}}:*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=500, help="spectators of one process (0: skip 1-3)")
    parser.add_argument("--rate", type=float, default=100.0, help="chunks a second, in total")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", type=int, default=2000, help="idle connections for the memory figure")
    parser.add_argument("--distributed", type=int, default=2000,
                        help="spectators over two processes on Redis (0: skip the distributed case)")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    raise_fd_limit()
    if args.clients:
        single(args)
    if args.distributed:
        distributed(args)


def single(args: argparse.Namespace) -> None:
    """Parts 1-3: one process, its baseline, memory per idle connection."""
    streamer = Streamer(args.rate, args.seconds)
    token = secrets.token_urlsafe(32)  # serve refuses owner tokens under 32 characters
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp) / "data", streamer, token)
        try:
            owner = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            world = owner.post("/api/worlds", json={"name": "Bench"}).json()["id"]
            owner.post(f"/api/worlds/{world}/agents", json={"name": "streamer", "provider": "openai", "model": "m",
                                                          "base_url": streamer.base_url}).raise_for_status()
            spectator = owner.post(f"/api/worlds/{world}/invites", json={"role": "spectator"}).json()["token"]
            ws_url = f"ws{url[4:]}/api/worlds/{world}/ws?after=1000000"
            headers = {"Authorization": f"Bearer {spectator}"}

            procs, _, results = run_clients(ws_url, headers, args.clients)
            owner.post(f"/api/worlds/{world}/messages", json={"content": "stream, please"}).raise_for_status()
            ours = summary(collect(procs, results))

            before = after = rss_kib(proc.pid)
            if args.idle:
                procs, _, results = run_clients(ws_url, headers, args.idle, idle=True)
                time.sleep(2)
                after = rss_kib(proc.pid)
                for _ in procs:
                    results.put("stop")
                for p in procs:
                    p.join(30)
        finally:
            proc.terminate()
            proc.wait(20)

    bare = baselines(args.clients, args.rate, args.seconds, per_delta=True)

    per_conn = (after - before) / args.idle if args.idle else 0.0  # --idle 0: not measured
    print(f"\n{args.clients} clients, {args.rate:g} chunks/s for {args.seconds:g} s ({os.cpu_count()} CPUs)\n")
    ok = report("agent-world /ws", ours, bare, 100.0)
    if args.idle:
        print(f"\nmemory per idle connection: {per_conn:.1f} KiB "
              f"(RSS {before / 1024:.1f} MiB -> {after / 1024:.1f} MiB with {args.idle} idle connections)")
    ok = ok and per_conn <= 64
    print(f"targets (p99 <= 100 ms, <= 2x each baseline{', <= 64 KiB/conn' if args.idle else ''}): "
          f"{'met' if ok else 'NOT met'}")


Figures = tuple[float, float, int]


def baselines(clients: int, rate: float, seconds: float, *, per_delta: bool) -> dict[str, Figures | str]:
    """The bare broadcast joined as ours (the floor at our frame rate) and, if asked, one frame per
    delta; a run that never finished is kept as the reason."""
    runs = {f"websockets, joined as ours ({CHUNK_INTERVAL * 1000:g} ms)": CHUNK_INTERVAL,
            **({"websockets, a frame per delta": 0.0} if per_delta else {})}
    figures: dict[str, Figures | str] = {}
    for name, join in runs.items():
        try:
            figures[name] = baseline(clients, rate, seconds, join)
        except Unfinished as exc:
            figures[name] = f"did not finish: {exc}"
    return figures


def report(name: str, ours: Figures, bare: dict[str, Figures | str], p99_target: float) -> bool:
    """Print ours and the baselines with the p99 ratios; whether p99 <= `p99_target` and <= 2x each baseline
    (one that did not finish has no ratio, and fails the target)."""
    print(f"{'':40}{'p50 ms':>10}{'p99 ms':>10}{'deltas':>10}{'p99 ratio':>11}")
    print(f"{name:40}{ours[0]:>10.1f}{ours[1]:>10.1f}{ours[2]:>10}")
    ok = ours[1] <= p99_target
    for label, figures in bare.items():
        if isinstance(figures, str):
            print(f"{label:40}{figures}")
            ok = False
            continue
        print(f"{label:40}{figures[0]:>10.1f}{figures[1]:>10.1f}{figures[2]:>10}{ours[1] / figures[1]:>11.2f}")
        ok = ok and ours[1] <= 2 * figures[1]
    return ok


def distributed(args: argparse.Namespace) -> None:
    """Part 4: two processes on Redis, and the bare broadcast to as many clients (joined as ours: one frame
    per delta does not keep up with 500 clients on a 2-core machine, let alone 2,000)."""
    spread = run_distributed(args.distributed, args.rate, args.seconds, args.redis_url)
    # shown now: the baseline run that follows can fail on a loaded machine
    print(f"agent-world, {args.distributed} spectators over 2 processes: p50 {spread[0]:.1f} ms, "
          f"p99 {spread[1]:.1f} ms, {spread[2]} deltas", flush=True)
    bare = baselines(args.distributed, args.rate, args.seconds, per_delta=False)
    print(f"\ndistributed: {args.distributed} clients over two processes on Redis, {args.rate:g} chunks/s for "
          f"{args.seconds:g} s\n")
    met = report("agent-world /ws, 2 procs", spread, bare, 150.0)
    print(f"targets (p99 <= 150 ms, <= 2x the baseline): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
