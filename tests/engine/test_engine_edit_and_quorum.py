"""Edit before approve, and the two-person rule: what a team decides together, through the engine."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.engine.actors import Actor
from server.engine.calls.refs import CallRef
from server.errors import AppError
from server.log import Claim, Close, Open, Tag
from server.testing.openai_double import Delay, OpenAIDouble, Text
from tests.fixtures.engine import MEMBER, OWNER, Harness, open_engine, reply_by_turn, run_on_request, tool_calls
from tests.fixtures.tools import ECHO_SERVER

MARIA = Actor("maria", vocab.MEMBER)


def _runs(harness: Harness) -> list[str]:
    path = harness.engine.workspace_for(harness.world) / "ran.txt"
    return path.read_text().splitlines() if path.exists() else []


async def _decide(harness: Harness, approval_id: str, actor: Actor, **content: object) -> vocab.Event:
    return await harness.engine.submit_tool_result(harness.world, actor, {
        "role": "tool", "tool_call_id": approval_id, "content": json.dumps({"scope": "once", **content})})


async def _refused(harness: Harness, approval_id: str, actor: Actor, code: str, **content: object) -> str:
    with pytest.raises(AppError) as caught:
        await _decide(harness, approval_id, actor, **content)
    assert caught.value.code == code, caught.value.message
    return caught.value.message


async def _final_answer(harness: Harness) -> None:
    await harness.wait_for(lambda e: e.get("role") == "assistant" and e.get("content") == "done", timeout=20)


# -- edit before approve --------------------------------------------------------------------

async def test_an_edited_call_runs_as_edited_and_the_llm_is_told_who_changed_what(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(run_on_request)
    await harness.say("run echo original >> ran.txt", actor=OWNER)
    [pending] = await harness.wait_pending(1)
    decision = await _decide(harness, pending["id"], MEMBER, decision="approve",
                             arguments={"command": "echo edited >> ran.txt"})
    assert decision["decision"]["changed"] == ["command"]
    await _final_answer(harness)
    assert _runs(harness) == ["edited"]
    told = next(m for m in harness.double.requests[-1].body["messages"] if m["role"] == "tool")["content"]
    assert 'max changed command before approving; the call ran with {"command": "echo edited >> ran.txt"}' in told
    audit = next(e for e in await harness.engine.audit(harness.world) if e["action"] == "decided")
    assert audit["original"] == {"command": "echo original >> ran.txt"}
    assert audit["arguments"] == {"command": "echo edited >> ran.txt"}


async def test_an_edit_cannot_slip_past_a_deny_rule_or_the_schema(harness: Harness) -> None:
    await harness.make_world("alice")
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "rm *"}, "deny",
                                            reason="no deleting")
    harness.double.respond_with(run_on_request)
    await harness.say("run echo harmless >> ran.txt")
    [pending] = await harness.wait_pending(1)
    message = await _refused(harness, pending["id"], MEMBER, vocab.FORBIDDEN, decision="approve",
                             arguments={"command": "rm -rf /"})
    assert "no deleting" in message
    await _refused(harness, pending["id"], MEMBER, vocab.INVALID, decision="approve", arguments={"cmd": "ls"})
    await _refused(harness, pending["id"], MEMBER, vocab.INVALID, decision="approve", scope="session",
                   arguments={"command": "ls"})
    assert [p["id"] for p in await harness.engine.pending_approvals(harness.world)] == [pending["id"]]
    assert _runs(harness) == []


async def test_an_edited_call_interrupted_by_a_restart_is_re_run_as_edited(tmp_path: Path,
                                                                          llm_double: OpenAIDouble) -> None:
    """Recovery re-derives the call from the log: the decision's arguments, never the LLM's."""
    engine, close = await open_engine(tmp_path)
    harness = Harness(engine, llm_double)
    await harness.make_world("alice")
    llm_double.respond_with(reply_by_turn(tool_calls(("file_write", {"path": "out.txt", "content": "original"})),
                                          after_tools=Text("done")))
    await harness.say("write it")
    [pending] = await harness.wait_pending(1)
    approval = await engine.store.log.get_open(harness.world, vocab.approval_key(pending["id"]))
    assert approval is not None
    call = (await engine.store.log.get_open(harness.world, vocab.call_key(pending["request"]["toolCallId"])))
    assert call is not None
    # Write the edited approval as a crashed process would have: decided and claimed, never run.
    ref = CallRef.find(call, pending["request"]["toolCallId"])
    assert ref is not None
    event = {"kind": vocab.MESSAGE, "id": vocab.new_id("msg"), "chat": "main", "agent": "alice",
             "sender": "human:max", "role": "tool", "tool_call_id": pending["id"], "content": "{}",
             "decision": {"decision": "approve", "scope": "once", "tool": "file_write",
                          "arguments": {"path": "out.txt", "content": "edited"}, "changed": ["content"],
                          "instance": "proc_dead"}, "instance": "proc_dead"}
    await engine.store.log.append(harness.world, event, [
        Close(vocab.approval_key(pending["id"])), Claim(vocab.exec_claim(ref.id)), Open(vocab.running_key(ref.id)),
        Tag(vocab.trail_tag(ref.id))])
    await close()
    engine, close = await open_engine(tmp_path)  # file_write is idempotent: re-run, with the edit
    try:
        harness = Harness(engine, llm_double, world=harness.world)
        await harness.wait_for(lambda e: e.get("role") == "assistant" and e.get("content") == "done", timeout=20)
        assert (engine.workspace_for(harness.world) / "out.txt").read_text() == "edited"
    finally:
        await close()


# -- the two-person rule --------------------------------------------------------------------

async def _two_person_world(harness: Harness, asker: Actor = MARIA) -> dict[str, Any]:
    await harness.make_world("alice")
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "rm *"}, "ask",
                                            approvals_required=2)
    harness.double.respond_with(run_on_request)
    await harness.say("run rm -f x", actor=asker)
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["approvalsRequired"] == 2 and pending["request"]["askedBy"] == asker.sender
    assert pending["request"]["options"] == ["deny", "approve_once"]
    return pending


async def test_a_two_person_request_runs_only_after_two_distinct_approvals(harness: Harness) -> None:
    pending = await _two_person_world(harness)
    await _decide(harness, pending["id"], MEMBER, decision="approve")
    [still] = await harness.engine.pending_approvals(harness.world)
    assert still["approved_by"] == ["human:max"]
    await _refused(harness, pending["id"], MEMBER, vocab.ALREADY_DECIDED, decision="approve")  # not twice
    await _refused(harness, pending["id"], MARIA, vocab.FORBIDDEN, decision="approve")  # she asked for it
    assert len(await harness.engine.pending_approvals(harness.world)) == 1
    assert not [e for e in await harness.events() if e.get("kind") == vocab.TOOL_STARTED or vocab.started_by(e)]
    final = await _decide(harness, pending["id"], OWNER, decision="approve")
    assert final["decision"]["voters"] == ["human:max", "human:olivia"] and final["decision"]["final"] is True
    await _final_answer(harness)
    assert await harness.engine.pending_approvals(harness.world) == []
    audit = [e["action"] for e in await harness.engine.audit(harness.world)]
    assert audit.count("approved_partly") == 1 and audit.count("decided") == 1


async def test_any_denial_ends_a_two_person_request_at_once(harness: Harness) -> None:
    pending = await _two_person_world(harness)
    await _decide(harness, pending["id"], MEMBER, decision="approve")
    await _decide(harness, pending["id"], OWNER, decision="deny", reason="not today")
    await _refused(harness, pending["id"], Actor("kim", vocab.MEMBER), vocab.ALREADY_DECIDED, decision="approve")
    await _final_answer(harness)
    assert await harness.engine.pending_approvals(harness.world) == []


async def test_concurrent_approvals_are_counted_by_the_log(harness: Harness) -> None:
    pending = await _two_person_world(harness)
    people = [Actor(f"member{i}", vocab.MEMBER) for i in range(6)]
    results = await asyncio.gather(*(_decide(harness, pending["id"], p, decision="approve") for p in people),
                                   return_exceptions=True)
    applied = [r for r in results if isinstance(r, dict)]
    assert [r["decision"]["final"] for r in applied].count(True) == 1 and len(applied) == 2
    assert all(isinstance(r, AppError) and r.code == vocab.ALREADY_DECIDED for r in results if not isinstance(r, dict))
    await _final_answer(harness)
    starts = [e for e in await harness.events() if vocab.started_by(e)]
    assert len(starts) == 1


async def test_a_half_collected_approval_survives_a_restart(tmp_path: Path, llm_double: OpenAIDouble) -> None:
    engine, close = await open_engine(tmp_path)
    harness = Harness(engine, llm_double)
    pending = await _two_person_world(harness)
    await _decide(harness, pending["id"], MEMBER, decision="approve")
    world = harness.world
    await close()
    engine, close = await open_engine(tmp_path)
    try:
        harness = Harness(engine, llm_double, world=world)
        [still] = await engine.pending_approvals(world)
        assert still["approved_by"] == ["human:max"]
        await _refused(harness, pending["id"], MEMBER, vocab.ALREADY_DECIDED, decision="approve")
        await _decide(harness, pending["id"], OWNER, decision="approve")
        await _final_answer(harness)
    finally:
        await close()


async def test_an_edit_is_refused_where_two_people_must_approve(harness: Harness) -> None:
    pending = await _two_person_world(harness)
    await _refused(harness, pending["id"], MEMBER, vocab.INVALID, decision="approve", arguments={"command": "ls"})


# -- found by review: what must not happen ---------------------------------------------------

async def test_an_allowance_added_later_never_counts_as_one_of_several_approvals(harness: Harness) -> None:
    pending = await _two_person_world(harness)
    await harness.engine.approvals.add_rule(harness.world, MEMBER, "shell_exec", {"command": "rm -f x"}, "allow")
    [still] = await harness.engine.pending_approvals(harness.world)
    assert still["approved_by"] == []  # a rule is not a person
    await _decide(harness, pending["id"], MEMBER, decision="approve")
    assert len(await harness.engine.pending_approvals(harness.world)) == 1  # one person so far, not two


async def test_an_allowance_added_later_does_not_approve_what_an_ask_rule_sends_to_people(harness: Harness) -> None:
    await harness.make_world("alice")
    await harness.engine.approvals.add_rule(harness.world, OWNER, "file_read", {"path": "secrets/*"}, "ask")
    harness.double.respond_with(reply_by_turn(tool_calls(("file_read", {"path": "secrets/key"})),
                                              after_tools=Text("done")))
    await harness.say("read it")
    await harness.wait_pending(1)
    await harness.engine.approvals.add_rule(harness.world, MEMBER, "file_read", {}, "allow")
    assert len(await harness.engine.pending_approvals(harness.world)) == 1


async def test_a_person_cannot_approve_what_a_deny_rule_added_since_the_request_covers(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(run_on_request)
    await harness.say("run echo x >> ran.txt")
    [pending] = await harness.wait_pending(1)
    # Written straight to the log, as another process's rule would be (no pending request is decided here).
    rule = {"id": "rule_late", "tool": "shell_exec", "match": {"command": "echo *"}, "effect": "deny",
            "reason": "frozen", "by": "human:olivia"}
    await harness.engine.store.append(harness.world, {"kind": vocab.RULE_ADDED, "rule": rule},
                                      [Open(vocab.rule_key("rule_late")), Tag(vocab.AUDIT_TAG)])
    message = await _refused(harness, pending["id"], MEMBER, vocab.FORBIDDEN, decision="approve")
    assert "frozen" in message
    await _final_answer(harness)  # the request was closed with that denial, and alice was told
    assert await harness.engine.pending_approvals(harness.world) == []
    assert _runs(harness) == []


async def test_the_one_who_asked_is_who_started_the_turn_not_who_spoke_last(harness: Harness) -> None:
    await harness.make_world("alice")
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "rm *"}, "ask",
                                            approvals_required=2)
    harness.double.respond_with(lambda body: Delay(1.0, tool_calls(("shell_exec", {"command": "rm -f x"})))
                                if body["messages"][-1]["role"] != "tool" else Text("done"))
    await harness.say("run rm -f x", actor=MARIA)
    await harness.double.wait_for_requests_async(1)
    await harness.say("and hurry", actor=MEMBER)  # max speaks while alice is thinking
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["askedBy"] == "human:maria"


async def test_an_edit_that_resends_a_hidden_value_is_refused(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(run_on_request)
    await harness.say("run echo x")
    [pending] = await harness.wait_pending(1)
    await _refused(harness, pending["id"], MEMBER, vocab.INVALID, decision="approve",
                   arguments={"command": "echo [redacted]"})


async def test_an_edit_that_resends_a_hidden_value_inside_a_list_is_refused(harness: Harness) -> None:
    await harness.make_world("alice", mcp_servers=[{"name": "echo", "command": sys.executable, "args": [ECHO_SERVER],
                                                    "trusted": True}])
    target = harness.engine.workspace_for(harness.world) / "lines.txt"
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("echo__append", {"path": str(target),
                                                                                   "lines": ["one"]}))))
    await harness.say("append a line")
    [pending] = await harness.wait_pending(1)
    message = await _refused(harness, pending["id"], MEMBER, vocab.INVALID, decision="approve",
                             arguments={"lines": ["one", "token [redacted]"]})
    assert "[redacted]" in message
    assert not target.exists()  # nothing ran with the placeholder


async def test_one_person_under_several_names_is_one_approval_and_never_the_asker_s(harness: Harness) -> None:
    # Who counts is who someone is (the invite they came in with), not the name they show: each
    # login of an unnamed invite used to get a new guest name, and one person met the rule alone.
    first_login = Actor("guest-1a2b", vocab.MEMBER, person=vocab.invitee_person("invite_asker"))
    pending = await _two_person_world(harness, asker=first_login)
    second_login = Actor("guest-9f9f", vocab.MEMBER, person=vocab.invitee_person("invite_asker"))
    await _refused(harness, pending["id"], second_login, vocab.FORBIDDEN, decision="approve")  # she asked
    helper = Actor("guest-3c3c", vocab.MEMBER, person=vocab.invitee_person("invite_helper"))
    await _decide(harness, pending["id"], helper, decision="approve")
    helper_again = Actor("guest-4d4d", vocab.MEMBER, person=vocab.invitee_person("invite_helper"))
    await _refused(harness, pending["id"], helper_again, vocab.ALREADY_DECIDED, decision="approve")
    [still] = await harness.engine.pending_approvals(harness.world)
    assert still["approved_by"] == ["human:guest-3c3c"]
    assert "invite_" not in json.dumps(await harness.events())  # who is behind a name stays on the server
    await _decide(harness, pending["id"], OWNER, decision="approve")
    await _final_answer(harness)


async def test_whoever_sent_a_message_from_before_people_were_recorded_still_cannot_approve_its_request(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn begun by a message stored without `person` (before the upgrade, or by an older process
    of a rolling deploy) names its asker by name only: the same invite is still the asker."""
    store, append = harness.engine.store, harness.engine.store.append

    async def as_before(world: str, event: vocab.Event, ops: object = ()) -> vocab.Event:
        if event.get("role") == "user":
            event = {k: v for k, v in event.items() if k != "person"}
        return await append(world, event, ops)  # type: ignore[arg-type]
    monkeypatch.setattr(store, "append", as_before)
    maria = Actor("maria", vocab.MEMBER, person=vocab.invitee_person("inv_maria"))
    pending = await _two_person_world(harness, asker=maria)
    monkeypatch.setattr(store, "append", append)
    await _refused(harness, pending["id"], maria, vocab.FORBIDDEN, decision="approve")
