"""Isolation of worlds: one world's heavy streaming and tool results must not stall another world.

    python bench/isolation.py [--size 1000000] [--mcp-size 20000000] [--mcp-limit 16777216] [--pages 5]
                              [--rounds 20]

1. Starts `agent-world serve` (temp data folder), the OpenAI double in a process of its own (at nice 10: it
   stands for a provider on other machines), and two worlds.
   World A: an agent that streams a `size`-character Markdown reply (each a text of its own: a rendering
   kept from an earlier round would make a reply look cheaper) to `pages` open page sockets, then calls
   an MCP tool (a real MCP server over stdio, this script with `--mcp`) whose result is `mcp-size` bytes
   (kept up to the world's `mcp_result_limit`: by default set to its most, 16 MiB; `--mcp-limit 1048576`
   measures a world left at the default setting, which reads the 20 MB message to its end and drops it,
   over four times the limit, with a note to the LLM).
   World B is measured all along: (http) `GET /api/worlds/B` latency, one request every 20 ms; (approval) a
   JSON WebSocket client says "run", gets the approval of `shell_exec("true")`, approves it: decision sent →
   the tool's result at the client. Baseline: the same, B alone, in the same run just before. `rounds` times
   (B alone, then A's load, in a new chat of A's), the samples pooled: one round gives about 70 approvals
   alone and 45 under A, whose p99 is then their slowest or slowest but one, a single stall of this shared
   machine. With three rounds the ratio of the two p99s still ranged 1.65-2.19 between runs of the same
   code, with ten (about 700 and 500 approvals) 1.48-2.19 (twelve runs, median 1.69): twenty (about 1,400
   and 1,000) make each p99 the tenth or fifteenth slowest, not one stall of the machine (about 7 minutes).
2. The server's CPU time (/proc utime + stime, its worker processes included) to stream replies of 10 KB,
   100 KB and 1 MB to one page.
Targets: B's p99 within 2x of its idle p99 and at most 50 ms; CPU growth within 1.5x of linear (10x the
size, at most 15x the time).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.common import cpu_probe, summary_ms, table  # noqa: E402

MCP_LIMIT = 16 * 1024 * 1024  # the most a world's `mcp_result_limit` may be


def markdown(size: int) -> str:
    """About `size` characters of Markdown: paragraphs, code blocks and lists, as a long reply has."""
    block = ("A paragraph about the **design**, with `inline code` and a [link](https://example.com/x).\n\n"
             "```python\ndef f(x: int) -> int:\n    return x * 2\n```\n\n- one point\n- another point\n\n")
    return (block * (size // len(block) + 1))[:size]


# -- the helpers in processes of their own ----------------------------------------------------------------------
def run_double() -> None:
    import server.testing.openai_double as od

    def respond(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return od.Text("ok", chunk_size=64)
        words = str(last.get("content") or "").split()
        if "stream" in words:  # a text of its own each time, as replies are (none found rendered before)
            size, head = int(words[words.index("stream") + 1]), f"Reply {secrets.token_hex(4)}.\n\n"
            return od.Text(head + markdown(max(0, size - len(head))), chunk_size=256)
        if "big" in words:
            return od.ToolCalls([(f"call_{secrets.token_hex(4)}", "big__big", json.dumps({"size": int(words[-1])}))])
        return od.ToolCalls([(f"call_{secrets.token_hex(4)}", "shell_exec", json.dumps({"command": "true"}))])

    # The double stands for a provider on other machines: it yields the CPU to the server here, so that B's
    # figures measure what A's work costs the server, not what the double's JSON costs this machine.
    os.nice(10)
    with od.OpenAIDouble() as double:
        double.respond_with(respond)
        print(f"PORT {double.base_url}", flush=True)
        threading.Event().wait()


def run_mcp() -> None:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("big")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def big(size: int) -> str:
        """`size` characters of text."""
        return ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]

    server.run()


# -- the measured client ----------------------------------------------------------------------------------------
class Probe:
    """B's HTTP latency and approval path, sampled until `stop` is set (in a process of its own: the page
    readers of the same run would otherwise delay its reads, and count as the server's latency)."""

    def __init__(self, url: str, token: str, world: str, stop: Any) -> None:
        self.url, self.token, self.world = url, token, world
        self.http: list[float] = []
        self.approval: list[float] = []
        self.stop = stop  # a multiprocessing Event

    async def run(self) -> None:
        await asyncio.gather(self._http(), self._approvals())

    async def _http(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}) as client:
            while not self.stop.is_set():
                began = time.perf_counter()
                (await client.get(f"/api/worlds/{self.world}")).raise_for_status()
                self.http.append(time.perf_counter() - began)
                await asyncio.sleep(0.02)

    async def _approvals(self) -> None:
        ws_url = f"ws{self.url[4:]}/api/worlds/{self.world}/ws?after=1000000000"
        async with connect(ws_url, additional_headers={"Authorization": f"Bearer {self.token}"}, max_size=None) as ws:
            n = 0
            while not self.stop.is_set():
                n += 1
                await ws.send(json.dumps({"type": "say", "content": f"run {n}"}))
                approval = await _event(ws, lambda e: any(c["function"]["name"] == "client.requestApproval"
                                                          for c in e.get("tool_calls") or []))
                call = json.loads(approval["tool_calls"][0]["function"]["arguments"])["toolCallId"]
                decided = time.perf_counter()
                await ws.send(json.dumps({"type": "tool_result", "message": {
                    "role": "tool", "tool_call_id": approval["tool_calls"][0]["id"],
                    "content": json.dumps({"decision": "approve", "scope": "once"})}}))
                await _event(ws, lambda e: e.get("role") == "tool" and e.get("tool_call_id") == call)  # noqa: B023
                self.approval.append(time.perf_counter() - decided)
                await _event(ws, lambda e: e.get("role") == "assistant" and e.get("content") == "ok")
                await asyncio.sleep(0.1)  # two frames a round: under the server's 20 client frames a second


def probe_process(url: str, token: str, world: str, stop: Any, out: Any) -> None:
    """Run a Probe until `stop`; put its samples (http, approval) on `out`."""
    probe = Probe(url, token, world, stop)
    asyncio.run(probe.run())
    out.put((probe.http, probe.approval))


async def probed(url: str, token: str, world: str, during: Any) -> tuple[list[float], list[float]]:
    """B's samples while `during` (a coroutine) runs, from a probe in a process of its own."""
    context = multiprocessing.get_context("spawn")
    stop, out = context.Event(), context.Queue()
    process = context.Process(target=probe_process, args=(url, token, world, stop, out))
    process.start()
    try:
        await asyncio.sleep(1.5)  # the probe's interpreter starts and connects
        await during
    finally:
        stop.set()
    samples = await asyncio.get_running_loop().run_in_executor(None, _samples, process, out)
    process.join(30)
    return samples


def _samples(process: Any, out: Any) -> tuple[list[float], list[float]]:
    """The probe's samples, once it puts them; a probe that ended without them (its error is above) ends
    the run, which would otherwise wait for them for ever."""
    while True:
        alive = process.is_alive()  # (before the wait: a probe that puts its samples and ends meanwhile is fine)
        try:
            samples: tuple[list[float], list[float]] = out.get(timeout=1)
            return samples
        except queue.Empty:
            if not alive:
                raise SystemExit(f"B's probe ended without its samples (exit code {process.exitcode})") from None


async def _event(ws: ClientConnection, want: Any, timeout: float = 120.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            text = await ws.recv(decode=True)
            if text.startswith('{"type":"event"'):
                event: dict[str, Any] = json.loads(text)["event"]
                if want(event):
                    return event
                if event.get("kind") == "agent_error":  # what it waits for will not come: say why at once
                    raise RuntimeError(f"the agent failed: {event.get('message')}")


_STORED_AGENT_MESSAGE = re.compile(r'<article id="m-([^"]+)" class="item item-agent"')  # (not "… streaming")


class Page:
    """A page socket that reads everything it is sent (until cancelled), and can tell when a stored
    message has reached it rendered."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.received = 0  # characters
        self._shown: set[str] = set()  # the stored agent messages that reached it
        self._arrived = asyncio.Event()

    async def read(self) -> None:
        async with connect(self.url, additional_headers={"Authorization": f"Bearer {self.token}"},
                           max_size=None) as ws:
            async for message in ws:
                text = message if isinstance(message, str) else message.decode()
                self.received += len(text)
                self._shown.update(_STORED_AGENT_MESSAGE.findall(text))
                self._arrived.set()

    async def shown(self, message_id: str) -> None:
        """Wait until the stored message `message_id` has reached this page (its final article)."""
        while message_id not in self._shown:
            self._arrived.clear()
            await asyncio.wait_for(self._arrived.wait(), timeout=600)


async def wait_reply(url: str, token: str, world: str, say: str, done: Any, chat: str = "main") -> dict[str, Any]:
    """Say `say` in `world` and wait for the event `done` holds for (returned)."""
    async with connect(f"ws{url[4:]}/api/worlds/{world}/ws?after=1000000000",
                       additional_headers={"Authorization": f"Bearer {token}"}, max_size=None) as ws:
        await ws.send(json.dumps({"type": "say", "content": say, "chat": chat}))
        return await _event(ws, done, timeout=600)


def _reply(event: dict[str, Any]) -> bool:
    return event.get("role") == "assistant" and bool(event.get("content")) and not event.get("tool_calls")


def cpu_seconds(pid: int) -> float:
    """CPU time of the server and its worker processes (server/offload.py), user and system."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if stat.parent.name == str(pid) or int(fields[1]) == pid:  # the server, or a child of it
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def settled(pid: int) -> None:
    """Wait until the server is idle (under 2% of a CPU over half a second): nothing left from before."""
    for _ in range(240):
        before = cpu_seconds(pid)
        await asyncio.sleep(0.5)
        if cpu_seconds(pid) - before < 0.01:
            return


@contextlib.asynccontextmanager
async def pages_open(url: str, token: str, world: str, chat: str, first: dict[str, Any],
                     count: int) -> AsyncIterator[list[Page]]:
    """`count` page sockets on `chat`, reading all they are sent; given once each has shown `first`, the
    chat's first reply. (They open after the event before it: from 0, a page would replay the rounds before
    too, a 16 MiB result each, and the rounds would not load alike.)"""
    pages = [Page(f"ws{url[4:]}/w/{world}/ws?chat={chat}&after={first['seq'] - 1}", token) for _ in range(count)]
    readers = [asyncio.create_task(page.read()) for page in pages]
    try:
        await asyncio.gather(*(page.shown(first["id"]) for page in pages))
        yield pages
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def load(url: str, token: str, a: str, chat: str, open_pages: list[Page], args: argparse.Namespace) -> None:
    """A's load: a `size`-character reply streamed to the open pages, then the MCP result and the answer
    after it; it lasts until every page has shown them."""
    began = time.perf_counter()
    reply = await wait_reply(url, token, a, f"stream {args.size}", _reply, chat)
    await asyncio.gather(*(page.shown(reply["id"]) for page in open_pages))
    streamed = time.perf_counter() - began
    results: list[str] = []  # the tool results on the way to the answer

    def answered(event: dict[str, Any]) -> bool:
        if event.get("role") == "tool":
            results.append(str(event.get("content") or ""))
        return _reply(event)
    answer = await wait_reply(url, token, a, f"big {args.mcp_size}", answered, chat)
    # Kept up to the limit; a message over 4x the limit is read to its end and dropped, with a note.
    # Anything else (an MCP server that never started, say) would measure the load without the result.
    if not any(len(result) >= 0.9 * min(args.mcp_size, args.mcp_limit) or "it was not read" in result
               for result in results):
        raise SystemExit(f"the MCP result never came: the tool said {[r[:300] for r in results]}")
    dropped = any("it was not read" in result for result in results)
    outcome = ("read to its end and dropped: over 4x the limit" if dropped
               else f"kept: {min(args.mcp_size, args.mcp_limit):,} bytes")
    await asyncio.gather(*(page.shown(answer["id"]) for page in open_pages))
    loaded_for = time.perf_counter() - began
    print(f"A's {args.size:,}-character reply shown on {args.pages} pages {streamed:.1f} s after it was "
          f"asked for, then a {args.mcp_size:,}-byte MCP result ({outcome}); load lasted {loaded_for:.1f} s; "
          f"the pages got {sum(page.received for page in open_pages):,} characters")


async def measure(url: str, token: str, a: str, b: str, args: argparse.Namespace, pid: int) -> None:
    idle_http: list[float] = []
    idle_approval: list[float] = []
    loaded_http: list[float] = []
    loaded_approval: list[float] = []
    for round_ in range(1, args.rounds + 1):
        # A chat of its own each round, whose pages replay only its first reply: each round loads alike.
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
            made = await client.post(f"/api/worlds/{a}/chats", json={"title": f"Round {round_}"})
            chat = made.raise_for_status().json()["id"]
        first = await wait_reply(url, token, a, "stream 1000", _reply, chat)
        await settled(pid)
        http, approval = await probed(url, token, b, asyncio.sleep(args.idle))
        idle_http += http
        idle_approval += approval
        async with pages_open(url, token, a, chat, first, args.pages) as open_pages:
            await settled(pid)  # their replay done
            http, approval = await probed(url, token, b, load(url, token, a, chat, open_pages, args))
        loaded_http += http
        loaded_approval += approval

    rows = []
    ok = True
    for name, base, under in (("http GET /api/worlds/B", idle_http, loaded_http),
                              ("approval: decision -> result", idle_approval, loaded_approval)):
        b50, b99, bn = summary_ms(base)
        l50, l99, ln = summary_ms(under)
        met = l99 <= max(2 * b99, 0) and l99 <= 50
        ok &= met
        rows.append((name, b50, b99, bn, l50, l99, max(under) * 1000, ln, "met" if met else "NOT met"))
    print(f"B's samples of {args.rounds} rounds, each {args.idle:.0f} s of B alone, then A's load:")
    print(table(["B measure (ms)", "p50 alone", "p99 alone", "n", "p50 under A", "p99 under A", "max under A",
                 "n", "p99 ≤ 2x alone and ≤ 50"], rows))

    cpu: list[tuple[int, float]] = []  # (in the last round's chat)
    async with pages_open(url, token, a, chat, first, 1) as [page]:
        for size in (10_000, 100_000, 1_000_000):
            await settled(pid)
            before = cpu_seconds(pid)
            streamed_reply = await wait_reply(url, token, a, f"stream {size}", _reply, chat)
            await page.shown(streamed_reply["id"])
            cpu.append((size, cpu_seconds(pid) - before))
    rows2 = [(f"{size:,}", seconds, seconds / cpu[0][1] if cpu[0][1] else float("nan")) for size, seconds in cpu]
    print(table(["reply characters, one page", "server CPU s", "x the 10 KB reply"], rows2))
    growth = [cpu[i + 1][1] / cpu[i][1] for i in range(2) if cpu[i][1]]
    print(f"growth per 10x: {', '.join(f'{g:.1f}x' for g in growth)} (target ≤ 15x); "
          f"isolation target {'met' if ok else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--mcp-size", type=int, default=20_000_000)
    parser.add_argument("--mcp-limit", type=int, default=MCP_LIMIT, help="world A's mcp_result_limit (bytes)")
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--idle", type=float, default=8.0, help="seconds of B alone, each round")
    parser.add_argument("--rounds", type=int, default=20, help="B alone then A's load, this many times (pooled)")
    parser.add_argument("--double", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mcp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--server-arg", action="append", default=[], help="passed to agent-world serve")
    args = parser.parse_args(sys.argv[1:])
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.double:
        return run_double()
    if args.mcp:
        return run_mcp()
    print(f"load average {os.getloadavg()[0]:.2f}, CPU probe {cpu_probe():.1f} ms")
    double = subprocess.Popen([sys.executable, __file__, "--double"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    token = secrets.token_urlsafe(32)
    try:
        assert double.stdout is not None
        llm = double.stdout.readline().split()[1]
        with tempfile.TemporaryDirectory() as tmp:
            proc, url = common.start_server(Path(tmp) / "data", token, llm, args.server_arg)
            try:
                owner = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
                worlds = []
                for name, settings in (("A", {"mcp_servers": [{"name": "big", "command": sys.executable,
                                                                "args": [__file__, "--mcp"], "trusted": True}],
                                              "mcp_result_limit": args.mcp_limit, "mcp_timeout": 300,
                                              "llm_timeout": 600}),
                                       # B's probe makes two LLM calls a round, about 140 in B's time alone: past
                                       # the default budget (120 a minute) each would wait 0.5 s, and B would
                                       # get ten rounds under A, not sixty.
                                       ("B", {"llm_calls_per_minute": 10_000})):
                    world = owner.post("/api/worlds", json={"name": f"Isolation {name}", "settings": settings})
                    world.raise_for_status()
                    worlds.append(world.json()["id"])
                    owner.post(f"/api/worlds/{worlds[-1]}/agents", json={
                        "name": "agent", "provider": "openai", "model": "m", "base_url": llm}).raise_for_status()
                asyncio.run(measure(url, token, worlds[0], worlds[1], args, proc.pid))
            finally:
                proc.terminate()
                proc.wait(20)
    finally:
        double.terminate()
        double.wait(10)
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
