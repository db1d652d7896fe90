"""The approval path end to end: real `agent-world serve`, the OpenAI double, a WebSocket client.

    python bench/e2e.py [--rounds 200] [--redis-url redis://127.0.0.1:6379/0] [--unsafe-no-sandbox]

Each round the client says something on its WebSocket; the agent's LLM (the OpenAI double, in a
process of its own) streams a `shell_exec("true")` call, which needs approval; the client
approves with a `tool_result` frame; the tool runs (sandboxed, as in production) and the LLM is
called again with its result.

(a) the last tool-call chunk leaving the double -> the approval frame at the client
(b) the decision sent -> the tool's result frame at the client
(c) the decision sent -> the next LLM request at the double
baselines, same run: a `say` frame sent -> its own event frame back (one append and one fan-out), and
`sh -c true` alone: in a sandbox started for it, in a pre-started one (as shell_exec runs it), and
unsandboxed (the floor under (b) and (c)).
`--unsafe-no-sandbox` runs the servers with that flag: the approval path without the sandbox's cost.

Embedded: one server. Distributed: two servers on one Redis; the agent runs on the first (it
hosted the world alone during the warm-up), the client is connected to the second.
Targets, p99: (a) <= 5 ms embedded and <= 10 ms across processes; (b) <= 8 ms;
(c) <= 10 ms embedded and <= 15 ms across processes. All clocks are this machine's time.time().
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import redis
from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.common import cpu_probe, summary_ms, table  # noqa: E402

WARMUP = 5
ROUND_PERIOD = 0.11  # seconds: a round sends 2 frames
TARGETS = {"embedded": {"a": 5.0, "b": 8.0, "c": 10.0}, "distributed": {"a": 10.0, "b": 8.0, "c": 15.0}}


# -- the double, in its own process -----------------------------------------------------------------------------
def run_double() -> None:
    """The OpenAI double, printing `REQ t` per request and `SENT t` once a tool-call stream's last
    tool-call chunk was written (stamped after the write drained, in its own event loop)."""
    import itertools

    import server.testing.openai_double as od

    ids = itertools.count()
    last_chunk: dict[Any, float] = {}
    send = od._send_event

    async def stamped(writer: Any, data: Any) -> None:
        await send(writer, data)
        choice = (data.get("choices") or [{}])[0] if isinstance(data, dict) else {}
        if choice.get("delta", {}).get("tool_calls"):
            last_chunk[writer] = time.time()
        elif choice.get("finish_reason") == "tool_calls":
            print(f"SENT {last_chunk.pop(writer):.6f}", flush=True)
    od._send_event = stamped  # this benchmark's own process: the double's module is not changed

    double = od.OpenAIDouble()

    def respond(body: dict[str, Any]) -> Any:
        request = double.last_request()
        print(f"REQ {request.received_at if request else time.time():.6f}", flush=True)
        if body["messages"][-1]["role"] == "tool":
            return od.Text("ok", chunk_size=64)
        call_id = f"call_e{next(ids)}"
        return od.ToolCalls([(call_id, "shell_exec", json.dumps({"command": "true"}))], interleave=False,
                            chunk_size=256)
    with double:
        double.respond_with(respond)
        print(f"PORT {double.base_url}", flush=True)
        threading.Event().wait()


class Double:
    """The double's process and the stamps it prints."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--double"], cwd=ROOT, stdout=subprocess.PIPE,
                                     text=True, stdin=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().split()
        self.base_url = first[1]
        self.lines: queue.Queue[tuple[str, float]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, stamp = line.split()
            self.lines.put((kind, float(stamp)))

    async def next(self, kind: str, timeout: float = 10.0) -> float:
        got, stamp = await asyncio.to_thread(self.lines.get, True, timeout)
        assert got == kind, f"expected {kind} from the double, got {got}"
        return stamp

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# -- servers ----------------------------------------------------------------------------------------------------
def start_server(data_dir: Path, token: str, double: Double, args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    return common.start_server(data_dir, token, double.base_url, args)


@contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.terminate()
        for proc in started:
            proc.wait(20)


# -- the client -------------------------------------------------------------------------------------------------
async def recv_event(ws: ClientConnection, want: Any, timeout: float = 10.0) -> tuple[float, dict[str, Any]]:
    """(arrival time, event) of the first event frame for which `want(event)` holds."""
    async with asyncio.timeout(timeout):
        while True:
            text = await ws.recv(decode=True)
            now = time.time()
            if not text.startswith('{"type":"event"'):
                continue
            event = json.loads(text)["event"]
            if want(event):
                return now, event


def _is_approval(event: dict[str, Any]) -> bool:
    return any(c["function"]["name"] == "client.requestApproval" for c in event.get("tool_calls") or [])


async def round_trip(ws: ClientConnection, double: Double, n: int) -> dict[str, float]:
    said = time.time()
    await ws.send(json.dumps({"type": "say", "content": f"run it {n}"}))
    echoed, _ = await recv_event(ws, lambda e: e.get("role") == "user" and e.get("content") == f"run it {n}")
    await double.next("REQ")
    arrived, approval = await recv_event(ws, _is_approval)
    sent = await double.next("SENT")
    request = json.loads(approval["tool_calls"][0]["function"]["arguments"])
    decided = time.time()
    await ws.send(json.dumps({"type": "tool_result", "message": {
        "role": "tool", "tool_call_id": approval["tool_calls"][0]["id"],
        "content": json.dumps({"decision": "approve", "scope": "once"})}}))
    call_id = request["toolCallId"]
    result, _ = await recv_event(ws, lambda e: e.get("role") == "tool" and e.get("tool_call_id") == call_id)
    next_request = await double.next("REQ")
    await recv_event(ws, lambda e: e.get("role") == "assistant" and e.get("content") == "ok")
    return {"a": arrived - sent, "b": result - decided, "c": next_request - decided, "base": echoed - said}


async def measure(ws_url: str, token: str, double: Double, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"a": [], "b": [], "c": [], "base": []}
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None) as ws:
        for n in range(rounds):
            began = time.monotonic()
            got = await round_trip(ws, double, n)
            if n >= WARMUP:
                for key, value in got.items():
                    out[key].append(value)
            # Let the turn's last writes settle; and two frames a round stay under the server's
            # 20 client frames a second (server/api/live/stream.py), which closes a faster client.
            await asyncio.sleep(max(0.02, ROUND_PERIOD - (time.monotonic() - began)))
    return out


def make_world(url: str, token: str, double: Double) -> str:
    owner = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    # Two LLM calls a round: past the world's default budget (120 a minute) each would wait its turn, 0.5 s,
    # and (c) would measure the budget, not the path.
    world: str = owner.post("/api/worlds", json={"name": f"E2E {secrets.token_hex(3)}",
                                                 "settings": {"llm_calls_per_minute": 10_000}}).json()["id"]
    owner.post(f"/api/worlds/{world}/agents", json={"name": "runner", "provider": "openai", "model": "m",
                                                   "base_url": double.base_url}).raise_for_status()
    return world


def ws_url(url: str, world: str) -> str:
    return f"ws{url[4:]}/api/worlds/{world}/ws?after=1000000000"


def run_embedded(double: Double, rounds: int, extra: list[str]) -> dict[str, list[float]]:
    token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory() as tmp, processes() as procs:
        proc, url = start_server(Path(tmp) / "data", token, double, extra)
        procs.append(proc)
        world = make_world(url, token, double)
        return asyncio.run(measure(ws_url(url, world), token, double, rounds))


def run_distributed(double: Double, rounds: int, redis_url: str, extra: list[str]) -> dict[str, list[float]]:
    token = secrets.token_urlsafe(32)
    prefix = f"awbench-{secrets.token_hex(6)}"
    args = ["--redis-url", redis_url, "--redis-prefix", prefix, *extra]
    try:
        with tempfile.TemporaryDirectory() as tmp, processes() as procs:
            proc, runner_url = start_server(Path(tmp) / "a", token, double, args)
            procs.append(proc)
            world = make_world(runner_url, token, double)
            # The first server alone hosts the world through a warm-up, so it holds the agent's lease.
            asyncio.run(measure(ws_url(runner_url, world), token, double, 2))
            proc, client_url = start_server(Path(tmp) / "b", token, double, args)
            procs.append(proc)
            return asyncio.run(measure(ws_url(client_url, world), token, double, rounds))
    finally:
        client = redis.Redis.from_url(redis_url)
        for pattern in (f"{{{prefix}:*", f"{{{prefix}}}:*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)
        client.close()


async def floors(rounds: int, sandboxed: bool) -> dict[str, list[float]]:
    """Seconds to run `sh -c true` to its exit: unsandboxed ("plain"), in a sandbox started for it
    ("sandbox", as before pre-started ones) and in a pre-started one ("warm", as shell_exec runs it;
    the next is built between rounds, as between two approvals). Interleaved, so that all three see
    the same machine."""
    from server.tools.sandbox import bubblewrap as sandbox
    from server.tools.sandbox import warm

    out: dict[str, list[float]] = {"plain": [], **({"sandbox": [], "warm": []} if sandboxed else {})}
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "ws"
        workspace.mkdir()
        box = sandbox.configure(hidden=[])
        if sandboxed and not box.sandboxed:
            raise SystemExit(f"no sandbox here: {box.startup_line()}")
        sandbox.prepare_workspace(workspace)
        env = {"PATH": os.defpath}

        async def run(kind: str) -> None:
            started = time.time()
            proc: asyncio.subprocess.Process
            if kind == "warm":
                proc = await warm.spawn(workspace, "true", timeout=10, network=False, env=env)
            else:
                argv = ["/bin/sh", "-c", "true"]
                proc = await asyncio.create_subprocess_exec(
                    *(sandbox.wrap(argv, workspace=workspace) if kind == "sandbox" else argv), cwd=workspace,
                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    start_new_session=True)
            await proc.communicate()
            out[kind].append(time.time() - started)
            if kind == "warm":
                warm.refill(workspace, network=False, env=env)
                await asyncio.gather(*warm._pools[asyncio.get_running_loop()].filling.values())

        warm.start()
        try:
            if sandboxed:
                await run("warm")  # the first one is cold
                out["warm"].clear()
            for _ in range(rounds):
                for kind in out:
                    await run(kind)
        finally:
            await warm.stop()
    return out


def report(mode: str, samples: dict[str, list[float]]) -> bool:
    names = {"a": "(a) last tool-call chunk -> approval at client", "b": "(b) decision -> tool result at client",
             "c": "(c) decision -> next LLM request", "base": "baseline: say -> own event back",
             "sandbox": "baseline: `true` alone, sandbox started for it", "warm": "baseline: same, pre-started sandbox",
             "plain": "baseline: `true` alone, no sandbox"}
    rows, ok = [], True
    for key, name in names.items():
        if key not in samples:
            continue
        p50, p99, count = summary_ms(samples[key])
        target = TARGETS[mode.split(",")[0]].get(key)
        met = "" if target is None else ("met" if p99 <= target else "NOT met")
        ok = ok and met != "NOT met"
        rows.append([name, p50, p99, count, "" if target is None else f"<= {target:g}", met])
    print(f"\n{mode}\n" + table(["", "p50 ms", "p99 ms", "n", "p99 target", ""], rows))
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0",
                        help="the Redis of the distributed case ('' to skip it)")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="serve with --unsafe-no-sandbox: the approval path without the sandbox")
    parser.add_argument("--double", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.double:
        run_double()
        return
    print(f"CPU probe: {cpu_probe():.1f} ms ({os.cpu_count()} CPUs); {args.rounds} rounds, {WARMUP} warm-up")
    double = Double()
    try:
        extra = ["--unsafe-no-sandbox"] if args.unsafe_no_sandbox else []
        suffix = ", no sandbox" if extra else ""
        embedded = run_embedded(double, args.rounds + WARMUP, extra)
        embedded.update(asyncio.run(floors(args.rounds, sandboxed=not extra)))
        ok = report("embedded" + suffix, embedded)
        if args.redis_url:
            spread = run_distributed(double, args.rounds + WARMUP, args.redis_url, extra)
            ok = report("distributed" + suffix, spread) and ok
    finally:
        double.stop()
    print(f"\ntargets: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
