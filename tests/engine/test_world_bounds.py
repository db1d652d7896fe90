"""Bounds on what a world holds (issue #30 item 3): agents, open chats, rules and session grants; past one,
adding is refused with `conflict` and nothing is written. One event's stored JSON is bounded too."""
from __future__ import annotations

import pytest

from server import events, vocab
from server.engine.approvals import rules as rulebook
from server.engine.world.worlds import MAX_AGENTS, MAX_CHATS
from server.errors import AppError
from server.log.codec import MAX_EVENT_BYTES
from tests.fixtures.engine import OWNER, Harness, run_on_request


async def test_a_world_holds_at_most_50_agents(harness: Harness) -> None:
    await harness.make_world("alice")
    for i in range(MAX_AGENTS - 1):
        await harness.engine.add_agent(harness.world, OWNER, {"name": f"a{i}"})
    last = (await harness.events())[-1]["seq"]
    with pytest.raises(AppError) as refused:
        await harness.engine.add_agent(harness.world, OWNER, {"name": "one_more"})
    assert (refused.value.code, refused.value.status) == (vocab.CONFLICT, 409)
    assert "50 agents" in refused.value.message
    assert (await harness.events())[-1]["seq"] == last
    await harness.engine.remove_agent(harness.world, OWNER, "a0")
    await harness.engine.add_agent(harness.world, OWNER, {"name": "one_more"})


async def test_a_world_holds_at_most_200_open_chats(harness: Harness) -> None:
    await harness.make_world("alice")  # its first chat, "main", counts
    for _ in range(MAX_CHATS - 1):
        await harness.engine.create_chat(harness.world, OWNER)
    with pytest.raises(AppError) as refused:
        await harness.engine.create_chat(harness.world, OWNER)
    assert refused.value.code == vocab.CONFLICT and "200 chats" in refused.value.message
    assert len(await harness.engine.worlds.chats(harness.world)) == MAX_CHATS


async def test_rules_and_session_grants_together_are_bounded(harness: Harness,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rulebook, "MAX_RULES", 3)  # the real bound is 500: the same code, fewer writes
    await harness.make_world("alice", "bob")
    harness.double.respond_with(run_on_request)
    await harness.say("@alice run echo a")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"], "approve", "session")  # a grant: 1
    await harness.say("@bob run echo b")  # alice's grant is not bob's
    [pending] = await harness.wait_pending(1)
    for tool in ("file_read", "file_write"):  # two rules: 3
        await harness.engine.add_rule(harness.world, OWNER, tool, None, "ask")
    with pytest.raises(AppError) as refused:
        await harness.engine.add_rule(harness.world, OWNER, "shell_exec", None, "deny")
    assert refused.value.code == vocab.CONFLICT and "3 rules and session grants" in refused.value.message
    with pytest.raises(AppError) as refused:  # a decision that would remember itself is refused whole
        await harness.decide(pending["id"], "approve", "always")
    assert refused.value.code == vocab.CONFLICT
    assert [p["id"] for p in await harness.engine.pending_approvals(harness.world)] == [pending["id"]]
    await harness.decide(pending["id"], "approve", "once")  # deciding once adds nothing: still taken


async def test_an_event_larger_than_the_log_takes_is_refused_before_anything_is_written(harness: Harness) -> None:
    await harness.make_world("alice")
    last = (await harness.events())[-1]["seq"]
    huge = "x" * (MAX_EVENT_BYTES + 1)
    with pytest.raises(AppError) as refused:
        await harness.engine.store.append(harness.world, events.notice("main", None, huge))
    assert refused.value.code == vocab.INVALID and "larger than the log takes" in refused.value.message
    assert (await harness.events())[-1]["seq"] == last
