"""Each refusal of a decision or client answer has its own code and runs nothing; members' refusals are
audited (repeats folded into one entry with a count), spectators' are only counted: they write nothing."""
from __future__ import annotations

import json
from typing import Any

import pytest

from server import vocab
from server.engine.actors import Actor
from server.errors import AppError
from tests.fixtures.engine import MEMBER, SPECTATOR, Harness, reply_by_turn, tool_calls


async def _pending_world(harness: Harness) -> dict[str, Any]:
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo x >> ran.txt"}))))
    await harness.say("go")
    [pending] = await harness.wait_pending(1)
    return pending


async def _refused(harness: Harness, code: str, *, actor: Actor = MEMBER, **message: Any) -> None:
    before = await harness.engine.pending_approvals(harness.world)
    with pytest.raises(AppError) as caught:
        await harness.engine.submit_tool_result(harness.world, actor, {"role": "tool", **message})
    assert caught.value.code == code
    assert await harness.engine.pending_approvals(harness.world) == before
    audit = await harness.engine.audit(harness.world)
    assert audit[-1]["action"] == "refused" and audit[-1]["code"] == code
    assert not (harness.engine.workspace_for(harness.world) / "ran.txt").exists()


async def test_spectator_cannot_decide_and_writes_nothing_by_trying(harness: Harness) -> None:
    pending = await _pending_world(harness)
    before = await harness.engine.store.log.last_seq(harness.world)
    for _ in range(30):
        with pytest.raises(AppError) as caught:
            await harness.engine.submit_tool_result(harness.world, SPECTATOR, {
                "role": "tool", "tool_call_id": pending["id"], "content": json.dumps({"decision": "approve"})})
        assert caught.value.code == vocab.FORBIDDEN
    assert await harness.engine.store.log.last_seq(harness.world) == before  # 30 frames, 0 events
    refused = harness.engine.metrics.refusals.labels(vocab.SPECTATOR, vocab.FORBIDDEN)._value.get()
    assert refused == 30
    assert len(await harness.engine.pending_approvals(harness.world)) == 1
    assert not (harness.engine.workspace_for(harness.world) / "ran.txt").exists()


async def test_a_members_repeated_refusals_are_folded_into_one_audit_entry(harness: Harness,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from server.engine.approvals import ownership
    monkeypatch.setattr(ownership, "FOLD_WINDOW", 0.3)
    await _pending_world(harness)
    for i in range(7):  # each with another id: ids do not defeat the folding
        with pytest.raises(AppError):
            await harness.engine.submit_tool_result(harness.world, MEMBER, {
                "role": "tool", "tool_call_id": f"approval_forged{i}", "content": "{}"})
    await harness.wait_for(lambda e: e.get("kind") == vocab.REFUSED and e.get("folded"))
    refusals = [e for e in await harness.engine.audit(harness.world) if e["action"] == "refused"]
    assert [r["count"] for r in refusals] == [1, 6]


async def test_a_folded_audit_entry_says_what_the_repeats_were(harness: Harness,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Refusals of one code are folded, but the entry names what was refused and which ids, not the first's."""
    from server.engine.approvals import ownership
    monkeypatch.setattr(ownership, "FOLD_WINDOW", 0.3)
    await _pending_world(harness)
    engine, world = harness.engine, harness.world
    for attempt in (lambda: engine.update_world(world, MEMBER, name="mine"), lambda: engine.delete_world(world, MEMBER),
                    lambda: engine.add_agent(world, MEMBER, {"name": "eve", "provider": "scripted"})):
        with pytest.raises(AppError):
            await attempt()
    for forged in ("approval_forgedA", "approval_forgedB", "approval_forgedC"):
        with pytest.raises(AppError):
            await engine.submit_tool_result(world, MEMBER, {"role": "tool", "tool_call_id": forged, "content": "{}"})
    await harness.wait_for(lambda e: e.get("kind") == vocab.REFUSED and e.get("folded"), count=2)
    folded = [e for e in await engine.audit(world) if e["action"] == "refused" and e["count"] > 1]
    by_code = {e["code"]: e for e in folded}
    assert "delete the world" in by_code[vocab.FORBIDDEN]["message"]
    assert "add agents" in by_code[vocab.FORBIDDEN]["message"]
    unknown = by_code[vocab.UNKNOWN_TOOL_CALL]
    assert unknown["tool_call_ids"] == ["approval_forgedB", "approval_forgedC"] and unknown["tool_call_id"] is None
    assert "approval_forgedA" not in unknown["message"] and "approval_forgedC" in unknown["message"]


async def test_an_id_never_issued_is_unknown(harness: Harness) -> None:
    await _pending_world(harness)
    await _refused(harness, vocab.UNKNOWN_TOOL_CALL, tool_call_id="approval_forged",
                   content=json.dumps({"decision": "approve"}))


async def test_an_approval_of_another_world_is_unknown_here(harness: Harness) -> None:
    other = await _pending_world(harness)
    await harness.make_world("bob")
    await _refused(harness, vocab.UNKNOWN_TOOL_CALL, tool_call_id=other["id"],
                   content=json.dumps({"decision": "approve"}))


async def test_a_second_decision_is_already_decided(harness: Harness) -> None:
    pending = await _pending_world(harness)
    await harness.decide(pending["id"], "deny")
    await harness.idle()
    await _refused(harness, vocab.ALREADY_DECIDED, tool_call_id=pending["id"],
                   content=json.dumps({"decision": "approve"}))


async def test_a_client_cannot_answer_a_server_tool_call(harness: Harness) -> None:
    pending = await _pending_world(harness)
    await _refused(harness, vocab.NOT_CLIENT_CALL, tool_call_id=pending["request"]["toolCallId"],
                   content=json.dumps({"output": "I ran it myself"}))


async def test_a_malformed_decision_is_invalid_and_keeps_the_approval_pending(harness: Harness) -> None:
    pending = await _pending_world(harness)
    for content in ("not json", json.dumps({"decision": "maybe"}),
                    json.dumps({"decision": "approve", "scope": "forever"}),
                    json.dumps({"decision": "approve", "scope": "once", "match": {"command": "x"}})):
        with pytest.raises(AppError) as caught:
            await harness.engine.submit_tool_result(harness.world, MEMBER,
                                                    {"role": "tool", "tool_call_id": pending["id"], "content": content})
        assert caught.value.code == vocab.INVALID
    assert len(await harness.engine.pending_approvals(harness.world)) == 1


async def test_a_pending_browser_call_reaches_every_reader_redacted(harness: Harness) -> None:
    # Spectators read pending browser calls in every snapshot and from /client-calls/pending.
    key = "sk-proj-" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0"
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("ui_notify", {"message": f"the key is {key}"}))))
    await harness.say("notify me")
    await harness.wait_for(lambda e: e.get("client_calls"))
    [call] = await harness.engine.pending_client_calls(harness.world)
    assert key not in json.dumps(call) and call["arguments"]["message"].startswith("the key is ")
    assert key not in json.dumps(await harness.engine.snapshot(harness.world))


async def test_a_client_tool_is_answered_by_a_member_once(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("ui_notify", {"message": "hello"}))))
    await harness.say("notify me")
    await harness.wait_for(lambda e: e.get("client_calls"))
    [call] = await harness.engine.pending_client_calls(harness.world)
    assert call["name"] == "ui_notify" and call["arguments"] == {"message": "hello"}
    with pytest.raises(AppError) as caught:
        await harness.engine.submit_tool_result(harness.world, SPECTATOR,
                                                {"role": "tool", "tool_call_id": call["id"], "content": "{}"})
    assert caught.value.code == vocab.FORBIDDEN
    await harness.engine.submit_tool_result(harness.world, MEMBER,
                                            {"role": "tool", "tool_call_id": call["id"], "content": '{"shown": true}'})
    await harness.idle()
    with pytest.raises(AppError) as caught:
        await harness.engine.submit_tool_result(harness.world, MEMBER,
                                                {"role": "tool", "tool_call_id": call["id"], "content": "{}"})
    assert caught.value.code == vocab.ALREADY_DECIDED
    assert harness.double.requests[-1].body["messages"][-1] == {
        "role": "tool", "tool_call_id": call["id"], "content": '{"shown": true}'}
