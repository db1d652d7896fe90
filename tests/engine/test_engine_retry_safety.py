"""Retry cannot be used to get around the rules: the asker of a two-person request stays the asker after
she stops and retries the reply (and the retrier is no independent approver either), and a retry racing
the agent's answer is refused by the log, not let through to a second LLM call."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from server import vocab
from server.engine.actors import Actor
from server.errors import AppError
from server.testing.openai_double import Stall, Status, Text
from tests.fixtures.engine import MEMBER, OWNER, Harness, run_on_request
from tests.fixtures.eventually import eventually_async

MARIA = Actor("maria", vocab.MEMBER)
RITA = Actor("rita", vocab.MEMBER)


async def _requests(harness: Harness, n: int) -> None:
    await eventually_async(lambda: len(harness.double.requests), accept=lambda count: count >= n, timeout=10,
                           what=f"{n} LLM requests")


async def _vote(harness: Harness, approval_id: str, actor: Actor) -> Any:
    return await harness.engine.submit_tool_result(harness.world, actor, {
        "role": "tool", "tool_call_id": approval_id, "content": json.dumps({"scope": "once", "decision": "approve"})})


async def _stop_and_retry(harness: Harness, asker: Actor, retrier: Actor) -> dict[str, Any]:
    await harness.make_world("alice")
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "rm *"}, "ask",
                                            approvals_required=2)
    harness.double.queue(Stall(after_chunks=2, then=Text("never finished at all, " * 20)))
    harness.double.respond_with(run_on_request)
    await harness.say("run rm -f x", actor=asker)
    await _requests(harness, 1)
    while not await harness.engine.cancel_turn(harness.world, asker, "alice"):  # once its call is in flight
        await asyncio.sleep(0.02)
    [stopped] = await harness.wait_for(lambda e: bool(e.get("stopped")))
    await harness.idle()
    await harness.engine.retry(harness.world, retrier, "alice", stopped["seq"])
    [pending] = await harness.wait_pending(1)
    return pending


async def test_the_asker_who_stopped_and_retried_still_cannot_approve(harness: Harness) -> None:
    pending = await _stop_and_retry(harness, MARIA, MARIA)
    assert pending["request"]["askedBy"] == "human:maria"
    with pytest.raises(AppError) as refused:
        await _vote(harness, pending["id"], MARIA)
    assert refused.value.code == vocab.FORBIDDEN
    first = await _vote(harness, pending["id"], MEMBER)
    assert first["decision"]["voters"] == ["human:max"] and not first["decision"]["final"]
    final = await _vote(harness, pending["id"], OWNER)
    assert final["decision"]["voters"] == ["human:max", "human:olivia"] and final["decision"]["final"]


async def test_whoever_retried_is_no_independent_approver(harness: Harness) -> None:
    pending = await _stop_and_retry(harness, MARIA, RITA)
    assert pending["request"]["askedBy"] == "human:maria"
    assert pending["request"]["retriedBy"] == ["human:rita"]
    for actor in (MARIA, RITA):
        with pytest.raises(AppError) as refused:
            await _vote(harness, pending["id"], actor)
        assert refused.value.code == vocab.FORBIDDEN


async def test_a_retry_racing_the_answer_is_refused(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Status(401, "bad key"), Text("answered"), Text("answered AGAIN"))
    await harness.say("hello?")
    await harness.idle()
    [error] = [e for e in await harness.events() if e["kind"] == vocab.AGENT_ERROR]
    memory = [vocab.memory_tag(error["chat"], "alice")]
    log = harness.engine.store.log
    read_tagged = log.read_tagged

    async def answered_meanwhile(world: str, tags: Sequence[str], after: int = 0, limit: int | None = None,
                                 newest: bool = False) -> list[vocab.Event]:
        found = await read_tagged(world, tags, after=after, limit=limit, newest=newest)
        if list(tags) == memory and after == error["seq"]:  # retry's "answered since?" read
            await harness.say("@alice are you there?")  # ... and the agent answers before the retry writes
            await harness.wait_for(lambda e: e.get("content") == "answered")
        return found

    log.read_tagged = answered_meanwhile  # type: ignore[method-assign]  # patched back in `finally`
    try:
        with pytest.raises(AppError) as refused:
            await harness.engine.retry(harness.world, MEMBER, "alice", error["seq"])
    finally:
        log.read_tagged = read_tagged  # type: ignore[method-assign]
    assert refused.value.code == vocab.CONFLICT
    await harness.idle()
    assert [e["content"] for e in await harness.events() if e.get("sender") == "alice"] == ["answered"]
    assert len(harness.double.requests) == 2
