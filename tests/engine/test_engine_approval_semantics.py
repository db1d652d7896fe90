"""Approvals mean exactly what they say: denials deny in their scope, grants cover one agent, every run is on
the record, new rules decide pending requests, and a deadline outlives the process that armed it."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.bus import Bus
from server.bus.redis import RedisBackend
from server.engine.engine import Engine
from server.log.redis.log import RedisLog
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.engine import MEMBER, OWNER, Harness, run_on_request, tool_calls
from tests.fixtures.eventually import eventually_async
from tests.fixtures.storage import delete_prefix, unique_name

CHILD = Path(__file__).parents[1] / "fixtures" / "engine_child.py"


def _runs(harness: Harness) -> list[str]:
    path = harness.engine.workspace_for(harness.world) / "ran.txt"
    return path.read_text().splitlines() if path.exists() else []


async def _ask(harness: Harness, command: str, agent: str | None = None,
               chat: str | None = None) -> dict[str, Any]:
    """Have `agent` (or every agent) ask to run `command`; returns the pending request."""
    before = {p["id"] for p in await harness.engine.pending_approvals(harness.world)}
    await harness.say((f"@{agent} " if agent else "") + f"run {command}", chat=chat)
    for _ in range(250):
        fresh = [p for p in await harness.engine.pending_approvals(harness.world) if p["id"] not in before]
        if fresh:
            return fresh[0]
        await asyncio.sleep(0.02)
    raise AssertionError("no approval was requested")


async def _result_of(harness: Harness, command: str) -> dict[str, Any]:
    """The tool result of the latest call that asked to run `command`."""
    def is_call(e: dict[str, Any]) -> bool:
        return any(json.loads(c["function"]["arguments"]).get("command") == command
                   for c in e.get("tool_calls") or () if c["function"]["name"] == "shell_exec")
    [*_, call] = await harness.wait_for(is_call, timeout=20)
    call_id = call["tool_calls"][0]["id"]  # a sandboxed shell can take seconds on a loaded machine
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("tool_call_id") == call_id,
                                      timeout=20)
    return result


@pytest.mark.parametrize("scope", ["session", "always"])
async def test_a_wide_denial_refuses_later_calls_without_running(harness: Harness, scope: str) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(run_on_request)
    first = await _ask(harness, "echo one >> ran.txt")
    await harness.decide(first["id"], "deny", scope, reason="not on the release branch")
    await harness.idle()
    await harness.say("run echo two >> ran.txt")
    result = await _result_of(harness, "echo two >> ran.txt")
    await harness.idle()
    assert json.loads(result["content"])["error"].endswith("not on the release branch")
    assert "denied" in json.loads(result["content"])["error"]
    assert result["not_run"] == "denied"  # what clients read to say "denied", never "ran"
    assert await harness.engine.pending_approvals(harness.world) == []
    assert _runs(harness) == []


async def test_a_session_grant_covers_the_agent_that_asked_and_no_other(harness: Harness) -> None:
    await harness.make_world("alice", "bob")
    harness.double.respond_with(run_on_request)
    first = await _ask(harness, "echo alice1 >> ran.txt", agent="alice")
    await harness.decide(first["id"], "approve", "session")
    await harness.say("@alice run echo alice2 >> ran.txt")
    await _result_of(harness, "echo alice2 >> ran.txt")  # ran without asking
    bobs = await _ask(harness, "echo bob >> ran.txt", agent="bob")  # bob asks again
    assert bobs["agent"] == "bob"
    assert _runs(harness) == ["alice1", "alice2"]


async def test_runs_allowed_by_a_rule_or_by_default_are_in_the_chat_and_the_audit(harness: Harness) -> None:
    await harness.make_world("alice")
    rule = await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "echo *"}, "allow")
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    await _result_of(harness, "echo hi")
    harness.double.respond_with(lambda body: Text("done") if body["messages"][-1]["role"] == "tool"
                                else tool_calls(("file_read", {"path": "ran.txt"})))
    await harness.say("read it")
    await harness.wait_for(lambda e: e.get("kind") == vocab.TOOL_STARTED and e.get("tool") == "file_read")
    await harness.idle()
    starts = [e for e in await harness.events() if e.get("kind") == vocab.TOOL_STARTED]
    assert [s["policy"]["reason"] for s in starts] == ["allowed by rule `command ~ echo *` of olivia",
                                                         "needs no approval"]
    assert starts[0]["policy"]["rule_id"] == rule["id"]
    audit = [e for e in await harness.engine.audit(harness.world) if e["action"] == "tool_started"]
    assert [(a["tool"], a["allowed_by"], a.get("rule_id")) for a in audit] == [
        ("shell_exec", "allowed by rule `command ~ echo *` of olivia", rule["id"]),
        ("file_read", "needs no approval", None)]


async def test_a_rule_added_while_requests_are_pending_decides_them(harness: Harness) -> None:
    await harness.make_world("alice", "bob")
    harness.double.respond_with(run_on_request)
    echo = await _ask(harness, "echo a >> ran.txt", agent="alice")
    ops = await harness.engine.worlds.create_chat(harness.world, OWNER, "Ops")  # alice hears nothing there
    rm = await _ask(harness, "rm -rf build", agent="bob", chat=ops["id"])
    rule = await harness.engine.approvals.add_rule(harness.world, MEMBER, "shell_exec",
                                                   {"command": "echo * >> ran.txt"}, "allow")
    await _result_of(harness, "echo a >> ran.txt")
    assert [p["id"] for p in await harness.engine.pending_approvals(harness.world)] == [rm["id"]]
    [decision] = await harness.wait_for(lambda e: e.get("tool_call_id") == echo["id"])
    assert decision["decision"]["policy"]["rule_id"] == rule["id"]
    assert decision["sender"] == vocab.SERVER_SENDER
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "rm *"}, "deny",
                                            reason="never delete")
    result = await _result_of(harness, "rm -rf build")
    assert "never delete" in json.loads(result["content"])["error"]
    assert await harness.engine.pending_approvals(harness.world) == []
    assert _runs(harness) == ["a"]


# -- deadlines outlive their process ---------------------------------------------------------

class Survivor:
    """An engine on a fresh Redis prefix, started on demand: the process that stays alive."""

    def __init__(self, redis_url: str, data_dir: Path) -> None:
        self.redis_url, self.data_dir, self.prefix = redis_url, data_dir, unique_name()
        self.engine: Engine | None = None
        self._closers: list[Any] = []

    async def start(self) -> Engine:
        log = await RedisLog.open(self.redis_url, self.prefix)
        bus = Bus(RedisBackend(self.redis_url))
        await bus.connect()
        self.engine = Engine(log, bus, data_dir=self.data_dir, lease_ttl=1.5)
        await self.engine.start()
        self._closers = [self.engine.stop, bus.disconnect, log.close]
        return self.engine

    async def close(self) -> None:
        for close in self._closers:
            await close()
        delete_prefix(self.redis_url, self.prefix)


@pytest.fixture
async def survivor(redis_url: str, tmp_path: Path) -> AsyncIterator[Survivor]:
    survivor = Survivor(redis_url, tmp_path)
    try:
        yield survivor
    finally:
        await survivor.close()


async def test_an_approval_timeout_fires_after_kill_9_of_the_process_that_armed_it(
        survivor: Survivor, redis_url: str, tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(lambda body: Text("understood") if body["messages"][-1]["role"] == "tool"
                            else tool_calls(("shell_exec", {"command": "echo x >> ran.txt"})))
    # The child creates the world and so runs alice's turns (it holds her lease first); the survivor
    # starts after it and hosts the world once it has work (the child's message: the child announces
    # it), before the request exists, so it only hears of it live.
    child = subprocess.Popen([sys.executable, str(CHILD), str(tmp_path), llm_double.base_url, "expiring",
                              redis_url, survivor.prefix], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        created = await asyncio.to_thread(child.stdout.readline)  # type: ignore[union-attr]
        assert created.startswith(b"WORLD"), child.stderr.read().decode()  # type: ignore[union-attr]
        world = created.split()[1].decode()
        engine = await survivor.start()
        assert not engine.hosts(world)  # idle: no process need host it
        child.stdin.write(b"go\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        line = (await asyncio.to_thread(child.stdout.readline)).decode()  # type: ignore[union-attr]
        assert line.startswith("READY"), child.stderr.read().decode()  # type: ignore[union-attr]
        await eventually_async(lambda: engine.hosts(world), timeout=8, what="the survivor to host the busy world")
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the process that wrote the request and armed its timer
        child.wait(10)
    # The deadline is 2 s after the request; then the survivor's runner asks the LLM again (slow under load).
    events = await eventually_async(lambda: engine.events(world), timeout=30, what="the request timed out",
                                    accept=lambda events: any(e.get("content") == "understood" for e in events),
                                    describe=lambda events: repr([(e["seq"], e.get("kind"), e.get("role"),
                                                                   e.get("sender")) for e in events]))
    [decision] = [e for e in events if e.get("decision")]
    assert decision["decision"]["timeout"] is True
    [result] = [e for e in events if e.get("role") == "tool" and not e.get("decision")]
    assert json.loads(result["content"])["error"] == "approval timed out"
    assert await engine.pending_approvals(world) == []
    assert not (tmp_path / "workspaces" / world / "ran.txt").exists()
