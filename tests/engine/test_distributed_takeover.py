"""Two engines on one Redis: a call approved on the process that does not run the agent, whose start
that process could not record in time, is still run by someone (the agent never waits for good)."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from server import vocab
from server.engine.engine import Engine
from server.log import Claim, Close, Open, Tag
from server.log.failures import StorageError
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.engine import MEMBER, OWNER, RedisEngines, reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually_async

TTL = 1.5


def _holder(engines: list[Engine], world: str) -> Engine | None:
    for engine in engines:
        runner = engine.hosting.runner(world, "alice")
        if runner is not None and runner.lease.holds:
            return engine
    return None


async def _said(engine: Engine, world: str, text: str) -> bool:
    return any(e.get("content") == text and e.get("role") == "assistant" for e in await engine.events(world))


async def test_a_call_approved_where_its_start_could_not_be_recorded_in_time_is_run_by_the_agents_runner(
        redis_engines: RedisEngines, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """d (which took the person's approval) lost Redis for a moment shorter than its lease: it could not
    write the `began` mark in time and gave the call up ("the agent's runner takes it over"). The runner
    is h's: it found d alive and took the call as still running there, for good."""
    a, b = await redis_engines.start(lease_ttl=TTL), await redis_engines.start(lease_ttl=TTL)
    llm_double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo x >> ran.txt"})),
                                          after_tools=Text("done")))
    world = (await a.create_world(OWNER, "shared", agents=[
        {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
    await eventually_async(lambda: b.hosts(world), timeout=8, what="b to host the world")
    holder = await eventually_async(lambda: _holder([a, b], world), timeout=8, what="a holder of alice's lease")
    assert holder is not None  # for the type checker: `eventually_async` returns a truthy value
    decider = b if holder is a else a
    await holder.post_message(world, MEMBER, "run it")
    [pending] = await eventually_async(lambda: decider.pending_approvals(world), timeout=8, what="the request")
    log = decider.store.log
    lease = log.lease
    cut = True

    async def cut_off(name: str, holder_: str, ttl: float, **where: Any) -> int:
        if cut and (name.startswith("began:") or name.startswith("proc:")):
            raise StorageError("Redis unreachable from this process a moment")
        return await lease(name, holder_, ttl, **where)
    monkeypatch.setattr(log, "lease", cut_off)
    call_id = pending["request"]["toolCallId"]
    await decider.submit_tool_result(world, MEMBER, {"role": "tool", "tool_call_id": pending["id"],
                                                     "content": json.dumps({"decision": "approve"})})
    await eventually_async(lambda: not decider.executor.busy(call_id), timeout=5, what="the decider to give up")
    cut = False
    await decider.leases.take()  # the moment heals: its heartbeat renews its lease, which never lapsed
    await eventually_async(lambda: _said(holder, world, "done"), timeout=4 * TTL + 5, what="the agent's answer")
    assert (a.workspace_for(world) / "ran.txt").read_text() == "x\n"


async def test_a_runner_paused_past_its_lease_while_taking_over_a_call_never_runs_it_a_second_time(
        redis_engines: RedisEngines, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """h's runner finds a call whose starter died before it began, and is paused (SIGSTOP) just before
    it starts it again. Its lease lapses; the other process takes the agent over, runs the call, and
    the turn ends. h wakes and starts the call: its retry is not fenced by the lease it lost."""
    a, b = await redis_engines.start(lease_ttl=TTL), await redis_engines.start(lease_ttl=TTL)
    llm_double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo x >> ran.txt"})),
                                          after_tools=Text("done")))
    world = (await a.create_world(OWNER, "shared", agents=[
        {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
    await eventually_async(lambda: b.hosts(world), timeout=8, what="b to host the world")
    holder = await eventually_async(lambda: _holder([a, b], world), timeout=8, what="a holder of alice's lease")
    assert holder is not None  # for the type checker: `eventually_async` returns a truthy value
    other = b if holder is a else a
    await holder.post_message(world, MEMBER, "run it")
    [pending] = await eventually_async(lambda: holder.pending_approvals(world), timeout=8, what="the request")
    # h's runner will stop (as if SIGSTOPped) right after it finds the call never began
    gate, paused = asyncio.Event(), asyncio.Event()
    may_have_begun = holder.executor.may_have_begun

    async def then_pause(call: Any) -> bool:
        began = await may_have_begun(call)
        paused.set()
        await gate.wait()
        return began
    monkeypatch.setattr(holder.executor, "may_have_begun", then_pause)
    # The approval as a process that died right after writing it made it: decided and claimed, never begun
    call_id = pending["request"]["toolCallId"]
    await holder.store.append(world, {
        "kind": vocab.MESSAGE, "id": vocab.new_id("msg"), "chat": "main", "agent": "alice", "sender": "human:max",
        "role": "tool", "tool_call_id": pending["id"], "content": json.dumps({"decision": "approve"}),
        "decision": {"decision": "approve", "scope": "once", "tool": "shell_exec"}, "instance": "proc_dead"},
        [Close(vocab.approval_key(pending["id"])), Claim(vocab.exec_claim(call_id)),
         Open(vocab.running_key(call_id)), Tag(vocab.trail_tag(call_id))])
    await eventually_async(lambda: paused.is_set(), timeout=4 * TTL, what="h's runner to take the call over")
    # h is stopped: its heartbeat renews nothing; the other process takes alice over and runs the call
    lease = holder.store.log.lease

    async def stopped(name: str, holder_: str, ttl: float, **where: Any) -> int:
        if name.startswith("agent:") and not gate.is_set():
            return 0
        return await lease(name, holder_, ttl, **where)
    monkeypatch.setattr(holder.store.log, "lease", stopped)
    await eventually_async(lambda: _said(other, world, "done"), timeout=4 * TTL + 5, what="the other's answer")
    gate.set()  # h wakes up
    await asyncio.sleep(2 * TTL)
    assert (a.workspace_for(world) / "ran.txt").read_text() == "x\n"
