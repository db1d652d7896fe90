"""Each reply knows what it answered, and each turn whom (issue 28, items 1 and 2).

A message said while an agent streams its reply is still unanswered: it gets a turn of its own, whose
LLM input ends with it. A request made in a turn counts as asked by the people that turn answers, not
by whoever spoke first since the agent last replied.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.engine.actors import Actor
from server.engine.turns.llm_input import prepare_input
from server.engine.turns.memory import TurnPeople, turn_people
from server.errors import AppError
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.api import all_events, client_for, make_world, wait_until
from tests.fixtures.engine import OWNER, Harness, run_on_request
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.storage import delete_prefix, unique_name
from web.render import render_event

MARIA = Actor("maria", vocab.MEMBER)
LONG = "Once upon a time " * 60  # streamed 4 characters at a time, 10 ms apart: about 2.5 s


def _answer_the_last_message(body: dict[str, Any]) -> Any:
    """What a model does: answer the input's last message (a long story for the first question)."""
    last = body["messages"][-1]
    if last["role"] != "user":
        return Text("hello")  # the input ends on the agent's own words: nothing to answer
    if "story" in last["content"]:
        return Text(LONG, delay=0.01)
    return Text(f"answering: {last['content']}")


# -- the LLM input -----------------------------------------------------------------------------------


def _m(seq: int, **fields: object) -> dict[str, Any]:
    return {"kind": "message", "seq": seq, "id": f"msg_{seq}", "chat": "c", **fields}


def test_what_was_said_while_a_reply_streamed_follows_that_reply() -> None:
    memory = [_m(1, sender="human:olivia", role="user", content="tell me a story"),
              _m(2, sender="human:maria", role="user", content="and what time is it?"),  # said mid-reply
              _m(3, agent="alice", sender="alice", role="assistant", content="Once upon a time", input_seq=1)]
    assert [m["content"] for m in prepare_input(agent="alice", system_prompt="", memory=memory)] == [
        "tell me a story", "Once upon a time", "and what time is it?"]


def test_what_was_said_while_a_call_was_made_follows_its_results() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "shell_exec", "arguments": "{}"}}
    memory = [_m(1, sender="human:olivia", role="user", content="list the files"),
              _m(2, sender="human:maria", role="user", content="and then stop"),
              _m(3, agent="alice", sender="alice", role="assistant", content=None, tool_calls=[call], input_seq=1),
              _m(4, agent="alice", sender="server", role="tool", tool_call_id="call_1", content="a.txt")]
    assert [(m["role"], m.get("content")) for m in prepare_input(agent="alice", system_prompt="", memory=memory)] == [
        ("user", "list the files"), ("assistant", None), ("tool", "a.txt"), ("user", "and then stop")]


def _asked(seq: int, sender: str, content: str = "@alice run rm -f x") -> dict[str, Any]:
    return _m(seq, sender=sender, person=f"person:{sender}", role="user", content=content, to=["alice"])


def test_a_turn_longer_than_the_memory_read_keeps_its_asker() -> None:
    """Only the tail of a long turn is read: its last tool-calling reply says whom the turn answers."""
    call = {"id": "call_9", "type": "function", "function": {"name": "shell_exec", "arguments": "{}"}}
    tail = [_m(40, agent="alice", sender="alice", role="assistant", content=None, tool_calls=[call], input_seq=39,
               answers=[1], asked_by=["human:maria"], people=["person:human:maria"]),
            _m(41, agent="alice", sender="server", role="tool", tool_call_id="call_9", content="ok")]
    assert turn_people(tail, "alice", ["alice"]).people == ["person:human:maria"]


def test_a_turn_ended_by_its_limit_or_a_failure_no_longer_counts_its_asker_unless_retried() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "shell_exec", "arguments": "{}"}}
    turn = [_asked(1, "human:maria"),
            _m(2, agent="alice", sender="alice", role="assistant", content=None, tool_calls=[call], input_seq=1,
               answers=[1], asked_by=["human:maria"], people=["person:human:maria"]),
            _m(3, agent="alice", sender="server", role="tool", tool_call_id="call_1", content="ok")]
    for end in ({"kind": "notice", "seq": 4, "chat": "c", "agent": "alice", "input_seq": 3},
                {"kind": "agent_error", "seq": 4, "chat": "c", "agent": "alice", "input_seq": 3}):
        later = [*turn, end, _asked(5, "human:olivia")]
        assert turn_people(later, "alice", ["alice"]).askers == ["human:olivia"]
    retried = [*turn, {"kind": "agent_error", "seq": 4, "chat": "c", "agent": "alice", "input_seq": 3},
               {"kind": "turn_retried", "seq": 5, "chat": "c", "agent": "alice", "sender": "human:joe",
                "person": "person:joe", "retry_of": 4}]
    assert turn_people(retried, "alice", ["alice"]) == TurnPeople(
        [1], ["human:maria"], ["human:joe"], ["person:human:maria", "person:joe"])


# -- both storage modes, on a real server -------------------------------------------------------------


@pytest.fixture(params=["embedded", "redis"])
def a_server(request: pytest.FixtureRequest, tmp_path: Path, llm_double: OpenAIDouble) -> Iterator[ServerProcess]:
    """One real server, embedded or on Redis."""
    args = ["--no-demo"]
    prefix = unique_name()
    redis_url: str | None = request.getfixturevalue("redis_url") if request.param == "redis" else None
    if redis_url:
        args += ["--redis-url", redis_url, "--redis-prefix", prefix]
    server = start_server(tmp_path / "data", llm=llm_double, args=args)
    try:
        yield server
    finally:
        server.stop()
        if redis_url:
            delete_prefix(redis_url, prefix)


def _replies(owner: Any, world: str, count: int) -> list[dict[str, Any]] | None:
    found = [e for e in all_events(owner, world) if e.get("sender") == "alice"]
    return found if len(found) >= count else None


def test_a_message_said_while_the_agent_streams_gets_a_turn_of_its_own(
        a_server: ServerProcess, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(_answer_the_last_message)
    with client_for(a_server, a_server.token) as owner:
        world = make_world(owner, llm_double)
        asked = owner.post(f"/api/worlds/{world}/messages", json={"content": "@alice tell me a story"})
        assert asked.status_code == 201, asked.text
        llm_double.wait_for_requests(1)  # alice is streaming her story now
        second = owner.post(f"/api/worlds/{world}/messages", json={"content": "@alice what time is it?"}).json()
        replies = wait_until(lambda: _replies(owner, world, 2), what="alice's two replies")
    story, answer = replies
    assert story["content"] == LONG and story["seq"] > second["seq"], "the question came while alice streamed"
    assert answer["content"] == "answering: @alice what time is it?"
    last_input = llm_double.requests[-1].body["messages"]
    assert last_input[-1] == {"role": "user", "name": "owner", "content": "@alice what time is it?"}
    assert [m["role"] for m in last_input[-3:]] == ["user", "assistant", "user"]
    assert story["input_seq"] < second["seq"] and answer["answers"] == [second["seq"]]


# -- whom a turn answers -----------------------------------------------------------------------------


async def _two_person_rule(harness: Harness, *agents: str) -> None:
    await harness.make_world(*agents)
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "rm *"}, "ask",
                                            approvals_required=2)


async def _approve(harness: Harness, approval_id: str, actor: Actor) -> vocab.Event:
    return await harness.decide(approval_id, actor=actor)


async def test_the_asker_is_who_spoke_to_the_agent_not_who_spoke_first(harness: Harness) -> None:
    await _two_person_rule(harness, "carol", "dave")
    harness.double.respond_with(run_on_request)
    await harness.say("@carol hello", actor=OWNER)
    # carol answers first: an input made after maria's message would end with it, and carol would run it too
    await harness.wait_for(lambda e: e.get("sender") == "carol" and e.get("role") == "assistant", timeout=15)
    await harness.say("@dave run rm -f x", actor=MARIA)
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["askedBy"] == "human:maria"
    assert pending["request"]["askers"] == ["human:maria"]
    with pytest.raises(AppError) as refused:
        await _approve(harness, pending["id"], MARIA)
    assert refused.value.code == vocab.FORBIDDEN and "you asked for this call" in refused.value.message
    vote = await _approve(harness, pending["id"], OWNER)  # the owner asked carol, not dave: she counts
    assert vote["decision"]["voters"] == ["human:olivia"] and vote["decision"]["final"] is False
    [asked] = [e for e in await harness.engine.audit(harness.world) if e["action"] == "approval_requested"]
    assert asked["asked_by"] == ["human:maria"]  # the audit says whom the call answered, as the request does


async def test_a_request_asked_while_the_agent_answered_another_names_its_asker(harness: Harness) -> None:
    await _two_person_rule(harness, "alice")
    harness.double.respond_with(lambda body: Text(LONG, delay=0.005) if "story" in body["messages"][-1].get(
        "content", "") else run_on_request(body))
    await harness.say("@alice tell me a story", actor=OWNER)
    await harness.double.wait_for_requests_async(1)
    await harness.say("@alice run rm -f x", actor=MARIA)  # while alice streams the story
    [pending] = await harness.wait_pending(1, timeout=15)
    assert pending["request"]["askedBy"] == "human:maria"
    with pytest.raises(AppError) as refused:
        await _approve(harness, pending["id"], MARIA)
    assert refused.value.code == vocab.FORBIDDEN
    [reply] = [e for e in await harness.events() if e.get("sender") == "alice" and e.get("tool_calls")]
    assert reply["asked_by"] == ["human:maria"]


async def test_an_agent_asked_by_another_agent_carries_the_person_who_asked_that_one(harness: Harness) -> None:
    await _two_person_rule(harness, "alice", "bob")
    harness.double.respond_with(lambda body: Text("@bob run rm -f x") if body["messages"][-1].get("name") == "maria"
                                else run_on_request(body))
    await harness.say("@alice please have bob clean up", actor=MARIA)
    [pending] = await harness.wait_pending(1)
    assert pending["agent"] == "bob" and pending["request"]["askedBy"] == "human:maria"
    with pytest.raises(AppError):
        await _approve(harness, pending["id"], MARIA)


async def test_a_request_that_cannot_reach_its_quorum_says_so_and_can_be_denied(harness: Harness) -> None:
    await _two_person_rule(harness, "alice")
    made = await harness.engine.invites.create(harness.world, OWNER, "member", "maria")
    maria = Actor("maria", vocab.MEMBER, person=vocab.invitee_person(made["id"]))
    owner = Actor("olivia", vocab.OWNER, person=vocab.OWNER_PERSON)
    harness.double.respond_with(run_on_request)
    await harness.say("run rm -f x", actor=maria)
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["quorumShort"] == (
        "needs 2 approvers; only 1 other person can approve: it can only be denied")
    denied = await harness.decide(pending["id"], decision="deny", actor=owner)
    assert denied["decision"]["decision"] == vocab.DENY
    assert await harness.engine.pending_approvals(harness.world) == []


async def test_a_request_that_can_reach_its_quorum_says_nothing_of_it(harness: Harness) -> None:
    await _two_person_rule(harness, "alice")
    for name in ("maria", "joe"):
        await harness.engine.invites.create(harness.world, OWNER, "member", name)
    harness.double.respond_with(run_on_request)
    await harness.say("run rm -f x", actor=Actor("olivia", vocab.OWNER, person=vocab.OWNER_PERSON))
    [pending] = await harness.wait_pending(1)
    assert "quorumShort" not in pending["request"]
    assert json.loads(json.dumps(pending["request"]))["approvalsRequired"] == 2


def test_the_queue_tells_everyone_a_request_cannot_reach_its_quorum() -> None:
    short = "needs 2 approvers; only 1 other person can approve: it can only be denied"
    request = {"toolCallId": "call_1", "toolName": "shell_exec", "toolArguments": {"command": "rm -f x"},
               "message": "", "options": ["deny", "approve_once"], "expiresAt": None, "approvalsRequired": 2,
               "askedBy": "human:maria", "askers": ["human:maria"], "quorumShort": short}
    event = {"kind": "message", "id": "msg_req", "seq": 7, "ts": "2026-11-22T13:19:58.193Z", "world": "w1",
             "chat": "main", "agent": "alice", "sender": "server", "role": "assistant", "content": None,
             "approval": request, "tool_calls": [{"id": "approval_call_1", "type": "function", "function": {
                 "name": vocab.REQUEST_APPROVAL, "arguments": json.dumps(request)}}]}
    for role in (vocab.OWNER, vocab.SPECTATOR):  # deciders and watchers alike
        html = render_event(event, role, frozenset()).elsewhere
        assert f'<p class="quorum-short" role="note">{short}</p>' in html and " · for maria</p>" in html
