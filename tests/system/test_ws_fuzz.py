"""Fuzzing the JSON WebSocket: thousands of valid, malformed and forged frames over long-lived connections.

Invariants: the server stays up, no forged or spectator decision runs a tool, and a well-behaved client beside
the fuzzers receives every persisted event exactly once, in order.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from server.testing.openai_double import OpenAIDouble, ToolCalls
from tests.fixtures.api import all_events, invite, make_world, wait_until
from tests.fixtures.server import ServerProcess
from tests.fixtures.ws import ws_connect

# 5,000 frames in all, over 24 paced connections: about 12 s of sending (10,000 over 16 took 35 s and found
# nothing more: every frame kind and both roles come up in the first few examples).
FRAMES_PER_EXAMPLE, EXAMPLES = 200, 25
CONNECTIONS_PER_ROLE = 12
SPACING = 0.056  # seconds between two frames of one connection: under the server's 20 frames a second


@dataclass
class Ids:
    """The tool call ids the fuzzers forge decisions with."""
    pending: str = ""  # this world's pending approval (only spectators may try it: members would be legitimate)
    call: str = ""  # the call behind it (run by the server: not answerable by a client)
    decided: str = ""  # an approval of this world already denied
    foreign: str = ""  # a pending approval of another world


IDS = Ids()

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=4), max_leaves=12)
_ref = st.none() | st.integers(-10, 10**6) | st.text(max_size=30) | st.just({"bad": "ref"})
_decision = st.sampled_from([json.dumps({"decision": d, "scope": s}) for d in ("approve", "deny")
                             for s in ("once", "session", "always")]) | st.text(max_size=40)


def _tool_result(ids: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    message = st.fixed_dictionaries({"role": st.sampled_from(["tool", "tool", "user"]), "tool_call_id": ids,
                                     "content": _decision})
    return st.fixed_dictionaries({"type": st.just("tool_result"), "message": message, "ref": _ref})


_forged_ids = st.one_of(st.builds(lambda: IDS.call), st.builds(lambda: IDS.decided), st.builds(lambda: IDS.foreign),
                        st.text(max_size=60), st.text(alphabet="0123456789abcdef", min_size=24, max_size=24).map(
                            lambda h: f"approval_{h}"), _json)
_common = st.one_of(
    st.fixed_dictionaries({"type": st.just("say"), "content": st.text(max_size=80), "ref": _ref},
                          optional={"chat": st.sampled_from(["main", "nope", 7, None])}),
    st.fixed_dictionaries({"type": st.just("resync"), "ref": _ref},
                          optional={"after": st.integers(-5, 10**7) | st.booleans()}),
    _tool_result(_forged_ids),
    st.dictionaries(st.sampled_from(["type", "content", "message", "after", "ref", "chat"]),
                    st.sampled_from(["say", "tool_result", "resync", "ack", "event"]) | _json, max_size=5),
).map(json.dumps) | st.text(max_size=100) | _json.map(json.dumps) | st.binary(max_size=40)
_spectator_only = _tool_result(st.builds(lambda: IDS.pending)).map(json.dumps)
FRAME = st.one_of(_common.map(lambda f: ("member", f)), _common.map(lambda f: ("spectator", f)),
                  _spectator_only.map(lambda f: ("spectator", f)))


@dataclass
class Fuzzer:
    """One long-lived connection sending paced frames, reading everything, reconnecting when closed."""
    server: ServerProcess
    world: str
    token: str
    queue: asyncio.Queue[str | bytes] = field(default_factory=asyncio.Queue)
    sent: int = 0
    closes: dict[int, int] = field(default_factory=dict)
    replies: dict[str, int] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            try:
                async with ws_connect(self.server, self.world, self.token, after=10**12, max_size=None) as ws:
                    reader = asyncio.create_task(self._read(ws))
                    try:
                        while True:
                            frame = await self.queue.get()
                            await ws.send(frame)
                            self.sent += 1
                            self.queue.task_done()
                            await asyncio.sleep(SPACING)
                    finally:
                        reader.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await reader
            except ConnectionClosed as exc:
                self.queue.task_done()  # that frame's send failed: it counts as sent to a closed connection
                code = exc.rcvd.code if exc.rcvd else 1006
                self.closes[code] = self.closes.get(code, 0) + 1

    async def _read(self, ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for text in ws:
                frame = json.loads(text)
                key = frame["type"] if frame["type"] != "error" else f"error:{frame['code']}"
                self.replies[key] = self.replies.get(key, 0) + 1


@dataclass
class Observer:
    """A well-behaved client: every event seq it receives."""
    seqs: list[int] = field(default_factory=list)

    async def run(self, server: ServerProcess, world: str) -> None:
        async with ws_connect(server, world, server.token, after=0, max_size=None) as ws:
            async for text in ws:
                frame = json.loads(text)
                if frame["type"] == "event":
                    self.seqs.append(frame["event"]["seq"])


class Loop:
    """An event loop on its own thread, so hypothesis drives a synchronous test over long-lived connections."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        # A stopped loop still holds its selector and self-pipe (an AF_UNIX socketpair): close them now,
        # not at the session's final gc (which reported "unclosed event loop" and two family=1 sockets).
        self.loop.close()


def _pending_ids(owner: httpx.Client, world: str) -> list[str]:
    return [p["id"] for p in owner.get(f"/api/worlds/{world}/approvals/pending").json()]


def _shell(command: str) -> ToolCalls:
    return ToolCalls([(f"call_fuzz_{abs(hash(command))}", "shell_exec", json.dumps({"command": command}))])


def _idle(owner: httpx.Client, world: str, agent: str) -> bool:
    return owner.get(f"/api/worlds/{world}").json()["status"][agent]["state"] in ("idle", "waiting_approval")


@pytest.fixture
def fuzz_world(server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> Iterator[str]:
    """A world with one denied approval and one pending `echo x >> ran.txt`; another world with its own pending one."""
    world = make_world(owner, llm_double, agents=("alice",))
    llm_double.queue(_shell("echo denied >> ran.txt"))
    owner.post(f"/api/worlds/{world}/messages", json={"content": "first"})
    IDS.decided = wait_until(lambda: _pending_ids(owner, world), what="the first approval")[0]
    denial = {"role": "tool", "tool_call_id": IDS.decided, "content": json.dumps({"decision": "deny"})}
    assert owner.post(f"/api/worlds/{world}/tool-results", json=denial).status_code == 201
    wait_until(lambda: len(llm_double.requests) >= 2 and _idle(owner, world, "alice"), what="alice idle")
    llm_double.queue(_shell("echo x >> ran.txt"))
    owner.post(f"/api/worlds/{world}/messages", json={"content": "second"})
    IDS.pending = wait_until(lambda: _pending_ids(owner, world), what="the second approval")[0]
    IDS.call = f"call_fuzz_{abs(hash('echo x >> ran.txt'))}"
    other = make_world(owner, llm_double, name="Other", agents=("bob",))
    llm_double.queue(_shell("echo foreign >> ran.txt"))
    owner.post(f"/api/worlds/{other}/messages", json={"content": "go"})
    IDS.foreign = wait_until(lambda: _pending_ids(owner, other), what="the other world's approval")[0]
    yield world


def test_fuzzed_frames_never_crash_the_server_nor_run_a_tool(server: ServerProcess, owner: httpx.Client,
                                                             fuzz_world: str) -> None:
    world = fuzz_world
    members = [invite(owner, world, "member", f"m{n}")["token"] for n in range(CONNECTIONS_PER_ROLE)]
    spectators = [invite(owner, world, "spectator", f"s{n}")["token"] for n in range(CONNECTIONS_PER_ROLE)]
    loop = Loop()
    observer = Observer()
    fuzzers = {"member": [Fuzzer(server, world, t) for t in members],
               "spectator": [Fuzzer(server, world, t) for t in spectators]}

    def start(fuzzer: Fuzzer) -> asyncio.Future[None]:
        return asyncio.ensure_future(fuzzer.run())
    for fuzzer in fuzzers["member"] + fuzzers["spectator"]:
        loop.loop.call_soon_threadsafe(start, fuzzer)
    loop.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(observer.run(server, world)))
    turn = {"member": 0, "spectator": 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture, HealthCheck.large_base_example])
    @given(st.lists(FRAME, min_size=FRAMES_PER_EXAMPLE, max_size=FRAMES_PER_EXAMPLE))
    def send_frames(frames: list[tuple[str, str | bytes]]) -> None:
        async def send() -> None:
            for role, frame in frames:
                fuzzer = fuzzers[role][turn[role] % CONNECTIONS_PER_ROLE]
                turn[role] += 1
                fuzzer.queue.put_nowait(frame)
            await asyncio.gather(*(f.queue.join() for f in fuzzers["member"] + fuzzers["spectator"]))
        loop.run(send())
        assert server.proc is not None and server.proc.poll() is None, server.log()[-3000:]

    try:
        send_frames()
        everyone = fuzzers["member"] + fuzzers["spectator"]
        sent = sum(f.sent for f in everyone)
        closes: dict[int, int] = {}
        replies: dict[str, int] = {}
        for f in everyone:
            for code, n in f.closes.items():
                closes[code] = closes.get(code, 0) + n
            for key, n in f.replies.items():
                replies[key] = replies.get(key, 0) + n
        print(f"\nfuzz: {sent} frames sent, closes by code {closes}, replies {replies}")
        assert sent + sum(closes.values()) >= FRAMES_PER_EXAMPLE * EXAMPLES
        assert httpx.get(f"{server.url}/healthz").status_code == 200
        assert "Exception in ASGI application" not in server.log()
        ran = server.data_dir / "workspaces" / world / "ran.txt"
        assert not ran.exists(), ran.read_text()
        assert IDS.pending in _pending_ids(owner, world)
        assert replies.get("error:forbidden", 0) > 0 and replies.get("error:invalid", 0) > 0
        logged = all_events(owner, world)
        wait_until(lambda: observer.seqs and observer.seqs[-1] >= logged[-1]["seq"], timeout=20,
                   what="the observer to catch up")
        assert observer.seqs[:logged[-1]["seq"]] == list(range(1, logged[-1]["seq"] + 1))
        # The legitimate decision runs it, once: the check above could have failed.
        decision = {"role": "tool", "tool_call_id": IDS.pending,
                    "content": json.dumps({"decision": "approve", "scope": "once"})}
        assert owner.post(f"/api/worlds/{world}/tool-results", json=decision).status_code == 201
        wait_until(ran.exists, what="the approved command")
        assert ran.read_text() == "x\n"
    finally:
        loop.close()

