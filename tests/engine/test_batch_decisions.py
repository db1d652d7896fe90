"""Batch decisions (issue #32 item 5): one decision on exactly the listed requests, each on the record
as its own decision, never wider than once."""
from __future__ import annotations

import pytest

from server import vocab
from server.errors import AppError
from tests.fixtures.engine import MEMBER, Harness, run_on_request


async def _three_then_a_fourth(harness: Harness) -> tuple[list[str], str]:
    await harness.make_world("alice", "bob", "carol", "dave")
    harness.double.respond_with(run_on_request)
    # One chat each: an agent whose turn ends never goes on to another's request (the double reads the last one).
    chats = {agent: (await harness.engine.worlds.create_chat(harness.world, MEMBER, agent))["id"]
             for agent in ("alice", "bob", "carol", "dave")}
    for agent in ("alice", "bob", "carol"):
        await harness.say(f"@{agent} run echo {agent} >> ran.txt", chat=chats[agent])
    shown = [p["id"] for p in await harness.wait_pending(3)]
    await harness.say("@dave run echo dave >> ran.txt", chat=chats["dave"])  # asked after the list was shown
    pending = await harness.wait_pending(4)
    [fourth] = [p["id"] for p in pending if p["id"] not in shown]
    return shown, fourth


async def test_a_batch_decides_exactly_the_listed_requests_each_on_the_record(harness: Harness) -> None:
    shown, fourth = await _three_then_a_fourth(harness)
    outcomes = await harness.engine.decide_listed(harness.world, MEMBER, shown, {"decision": "deny",
                                                                                 "reason": "not now"})
    assert [(o["id"], o["outcome"]) for o in outcomes] == [(i, "decided") for i in shown]
    left = await harness.engine.pending_approvals(harness.world)
    assert [p["id"] for p in left] == [fourth], [(p["agent"], p["request"]["toolArguments"]) for p in left]
    decisions = [e for e in await harness.events() if e.get("decision") and e.get("tool_call_id") in shown]
    assert sorted(e["tool_call_id"] for e in decisions) == sorted(shown)  # one decision each
    assert {(e["sender"], e["decision"]["scope"], e["decision"]["reason"]) for e in decisions} == {
        ("human:max", "once", "not now")}
    # Listed again (a second click, or another person's list): nothing is decided twice.
    again = await harness.engine.decide_listed(harness.world, MEMBER, [*shown, fourth], {"decision": "deny"})
    assert [o["outcome"] for o in again] == [vocab.ALREADY_DECIDED] * 3 + ["decided"]


@pytest.mark.parametrize("content", [
    {"decision": "approve", "scope": "session"}, {"decision": "approve", "scope": "always"},
    {"decision": "approve", "scope": "for", "minutes": 30}, {"decision": "deny", "scope": "always"},
    {"decision": "approve", "scope": "once", "arguments": {"command": "true"}}])
async def test_a_batch_never_grants_a_wider_scope_than_once(harness: Harness, content: dict[str, object]) -> None:
    shown, _ = await _three_then_a_fourth(harness)
    with pytest.raises(AppError) as refused:
        await harness.engine.decide_listed(harness.world, MEMBER, shown, content)
    assert refused.value.code == vocab.INVALID
    assert len(await harness.engine.pending_approvals(harness.world)) == 4
    assert await harness.engine.grants(harness.world) == []
    assert await harness.engine.approvals.rules(harness.world) == []
