"""Elicitation through the approval queue (issue #15): an MCP server's question becomes a pending item of
the calling agent's queue (`elicitation_<n>_<call id>`), answered like a client call by a `role: "tool"`
message; accepted answers are checked against the form's schema; the LLM never sees any of it; a
session that dies while a question is pending closes it as interrupted."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.bus import Bus
from server.bus.redis import RedisBackend
from server.engine.engine import Engine
from server.errors import AppError
from server.log import Open
from server.log.failures import StorageError
from server.log.redis.log import RedisLog
from server.tools.mcp.forms import check_answer, check_schema
from tests.fixtures.engine import (
    MEMBER,
    OWNER,
    SPECTATOR,
    Harness,
    bus_refuses_once,
    log_refuses_once,
    reply_by_turn,
    tool_calls,
)
from tests.fixtures.storage import delete_prefix, unique_name
from web.render import render_event

TROUBLE = str(Path(__file__).parents[1] / "fixtures" / "mcp_trouble_server.py")


async def _asked(harness: Harness, **args: Any) -> dict[str, Any]:
    await harness.make_world("alice", mcp_servers=[{"name": "t", "command": sys.executable, "args": [TROUBLE],
                                                    "tools": {"book": {"approval": "never"}}}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__book", args))))
    await harness.say("book a table")
    [question] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    return question


async def _answer(harness: Harness, question: dict[str, Any], answer: object, actor: Any = MEMBER) -> Any:
    return await harness.engine.submit_tool_result(harness.world, actor, {
        "role": "tool", "tool_call_id": question["tool_calls"][0]["id"], "content": json.dumps(answer)})


async def test_a_question_is_queued_validated_answered_and_hidden_from_the_llm(harness: Harness) -> None:
    question = await _asked(harness)
    [call] = question["tool_calls"]
    request = question["elicitation"]
    assert call["function"]["name"] == "client.elicit" and call["id"] == "elicitation_1_" + request["toolCallId"]
    assert question["agent"] == "alice" and request["toolName"] == "t__book"
    schema = request["requestedSchema"]
    assert schema["properties"]["guests"]["type"] == "integer" and schema["properties"]["email"]["format"] == "email"
    assert [e["id"] for e in await harness.engine.elicitations.pending(harness.world)] == [question["id"]]
    with pytest.raises(AppError) as refused:  # a spectator cannot answer
        await _answer(harness, question, {"action": "decline"}, SPECTATOR)
    assert refused.value.code == vocab.FORBIDDEN
    for bad, why in (({"action": "accept", "content": {"guests": 0, "email": "a@b.co"}}, "at least 1"),
                     ({"action": "accept", "content": {"guests": 2, "email": "nope"}}, "valid email"),
                     ({"action": "accept", "content": {"email": "a@b.co"}}, "guests is required"),
                     ({"action": "maybe"}, "accept")):
        with pytest.raises(AppError, match=why) as caught:
            await _answer(harness, question, bad)
        assert caught.value.code == vocab.INVALID
    await _answer(harness, question, {"action": "accept", "content": {"guests": 3, "email": "max@example.com"}})
    with pytest.raises(AppError) as late:
        await _answer(harness, question, {"action": "decline"}, OWNER)
    assert late.value.code == vocab.ALREADY_DECIDED
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book", timeout=15)
    assert result["content"] == "booked for 3 (max@example.com, vegetarian=False)"
    await harness.idle(timeout=10)
    assert await harness.engine.elicitations.pending(harness.world) == []
    sent = json.dumps([r.body["messages"] for r in harness.double.requests])
    assert "elicit" not in sent and "How many guests" not in sent  # the LLM never saw the question


async def test_a_declined_question_gives_the_tool_its_decline(harness: Harness) -> None:
    question = await _asked(harness)
    await _answer(harness, question, {"action": "decline"})
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book", timeout=15)
    assert result["content"] == "not booked: decline"


async def test_a_question_times_out_as_cancel(harness: Harness) -> None:
    await harness.make_world("alice", approval_timeout=1, mcp_servers=[
        {"name": "t", "command": sys.executable, "args": [TROUBLE], "tools": {"book": {"approval": "never"}}}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__book", {}))))
    await harness.say("book")
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book", timeout=15)
    assert result["content"] == "not booked: cancel"
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")))
    assert closed["elicitation_answer"] == {"action": "cancel", "reason": "timeout"} and closed["sender"] == "server"


async def test_a_session_that_dies_while_asking_interrupts_the_call_and_closes_the_question(harness: Harness) -> None:
    question = await _asked(harness, then_crash=True)
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book", timeout=15)
    assert "interrupted" in result["content"], result
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")), timeout=10)
    assert closed["tool_call_id"] == question["tool_calls"][0]["id"]
    assert closed["elicitation_answer"]["reason"] == "interrupted"
    assert await harness.engine.elicitations.pending(harness.world) == []


@pytest.mark.parametrize("published", ["published", "its publish refused", "the waiter fell behind"])
async def test_an_answer_taken_by_another_process_reaches_the_one_running_the_call(
        redis_url: str, tmp_path: Path, llm_double: Any, monkeypatch: pytest.MonkeyPatch, published: str) -> None:
    """Also when Redis refused the answer's publish, or a burst of frames cut the waiter off (it fell 1,000
    behind): the process running the call heard nothing, and waited for the question's timeout (10
    minutes) before."""
    prefix, opened = unique_name(), []  # two engines sharing one Redis, as two processes would
    try:
        for _ in range(2):
            log = await RedisLog.open(redis_url, prefix)
            bus = Bus(RedisBackend(redis_url))
            await bus.connect()
            engine = Engine(log, bus, data_dir=tmp_path, lease_ttl=1.5)
            await engine.start()
            opened.append((engine, log, bus))
        first = opened[0][0]
        harness = Harness(first, llm_double)
        question = await _asked(harness)
        world = harness.world
        runs = [e for e, _, _ in opened if e.world_tools.status(world).get("t", {}).get("calls")]
        [running] = runs  # exactly one process runs the call and holds its MCP session
        other = next(e for e, _, _ in opened if e is not running)
        if published == "its publish refused":
            bus_refuses_once(other, monkeypatch, lambda message: "elicitation_answer" in message)
        elif published == "the waiter fell behind":
            bus, name = running.store.bus, f"world:{world}"
            for i in range(1500):  # all at once: no listener gets a turn in between
                bus.deliver_here(name, f'{{"type":"chunk","agent":"bob","message_id":"m","delta":"x","index":{i}}}')
        await other.submit_tool_result(world, MEMBER, {
            "role": "tool", "tool_call_id": question["tool_calls"][0]["id"],
            "content": json.dumps({"action": "accept", "content": {"guests": 2, "email": "a@example.org"}})})
        [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book",
                                          timeout=15)
        assert result["content"] == "booked for 2 (a@example.org, vegetarian=False)"
    finally:
        for engine, log, bus in opened:
            await engine.stop(grace=1)
            await bus.disconnect()
            await log.close()
        delete_prefix(redis_url, prefix)


def test_a_question_renders_as_a_form_in_the_queue_and_its_answer_removes_it() -> None:
    schema = {"type": "object", "required": ["guests"], "properties": {
        "guests": {"type": "integer", "title": "Guests", "minimum": 1, "maximum": 10},
        "email": {"type": "string", "format": "email", "description": "<b>where</b>"},
        "diet": {"type": "string", "enum": ["veg", "any"], "enumNames": ["Vegetarian", "Anything"]},
        "extras": {"type": "array", "items": {"anyOf": [{"const": "cake", "title": "Cake"}]}},
        "agree": {"type": "boolean", "default": True}}}
    question = {"kind": "message", "id": "msg_1", "seq": 7, "chat": "main", "agent": "alice", "sender": "server",
                "role": "assistant", "content": None, "ts": "2026-11-22T10:00:00.000Z",
                "tool_calls": [{"id": "elicitation_call_1", "type": "function",
                                "function": {"name": "client.elicit", "arguments": "{}"}}],
                "elicitation": {"toolCallId": "call_1", "toolName": "t__book", "message": "How <many>?",
                                "requestedSchema": schema, "expiresAt": None}}
    member = render_event(question, vocab.MEMBER, frozenset()).in_view
    assert 'id="elicitation-elicitation_call_1"' in member and 'data-append-to="#approval-list"' in member
    assert 'type="number" name="guests"' in member and 'min="1"' in member and "required" in member
    assert 'type="email" name="email"' in member and '<option value="veg">Vegetarian</option>' in member
    assert 'type="checkbox" name="extras" value="cake"' in member and 'name="agree" checked' in member
    assert "How &lt;many&gt;?" in member and "&lt;b&gt;where&lt;/b&gt;" in member  # escaped
    spectator = render_event(question, vocab.SPECTATOR, frozenset()).in_view
    assert "<form" not in spectator and "A member answers this one." in spectator
    answer = {"kind": "message", "id": "msg_2", "seq": 8, "chat": "main", "agent": "alice", "sender": "human:max",
              "role": "tool", "tool_call_id": "elicitation_call_1", "content": '{"action": "decline"}',
              "elicitation_answer": {"action": "decline"}}
    assert '<div id="elicitation-elicitation_call_1" hx-swap-oob="delete">' in render_event(
        answer, vocab.MEMBER, frozenset()).in_view


async def test_a_question_left_by_a_dead_process_closes_when_its_call_is_reported_interrupted(
        harness: Harness) -> None:
    await harness.make_world("alice")
    # What a process that died mid-question leaves in the log: the question, open, and nobody waiting.
    question = {"kind": "message", "id": vocab.new_id("msg"), "chat": "main", "agent": "alice", "sender": "server",
                "role": "assistant", "content": None, "elicitation": {"toolCallId": "call_dead", "requestedSchema": {}},
                "tool_calls": [{"id": "elicitation_call_dead", "type": "function",
                                "function": {"name": "client.elicit", "arguments": "{}"}}]}
    await harness.engine.store.append(harness.world, question, [Open("elicitation:elicitation_call_dead")])
    assert len(await harness.engine.elicitations.pending(harness.world)) == 1
    # The process that recovers the call reports it interrupted (as runner._interrupted does).
    await harness.engine.store.append(harness.world, {
        "kind": "message", "id": vocab.new_id("msg"), "chat": "main", "agent": "alice", "sender": "server",
        "role": "tool", "tool_call_id": "call_dead", "name": "t__book", "content": '{"error": "interrupted"}'})
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")))
    assert closed["tool_call_id"] == "elicitation_call_dead"
    assert closed["elicitation_answer"] == {"action": "cancel", "reason": "interrupted"}
    assert await harness.engine.elicitations.pending(harness.world) == []


async def test_a_calls_result_closes_only_its_own_questions_not_a_namesakes(harness: Harness) -> None:
    # Call ids are the LLM's: `call_a`'s questions once shared a prefix (and an id) with `call_a_2`'s.
    await harness.make_world("alice")

    def question_of(call_id: str) -> dict[str, Any]:
        return {"kind": "message", "id": vocab.new_id("msg"), "chat": "main", "agent": "alice", "sender": "server",
                "role": "assistant", "content": None, "elicitation": {"toolCallId": call_id, "requestedSchema": {}},
                "tool_calls": [{"id": f"elicitation_1_{call_id}", "type": "function",
                                "function": {"name": "client.elicit", "arguments": "{}"}}]}
    for call_id in ("call_a", "call_a_2"):
        opened = [Open(f"elicitation:elicitation_1_{call_id}")]
        await harness.engine.store.append(harness.world, question_of(call_id), opened)
    await harness.engine.store.append(harness.world, {
        "kind": "message", "id": vocab.new_id("msg"), "chat": "main", "agent": "alice", "sender": "server",
        "role": "tool", "tool_call_id": "call_a", "name": "t__book", "content": '{"error": "interrupted"}'})
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")))
    assert closed["tool_call_id"] == "elicitation_1_call_a"
    await asyncio.sleep(0.2)  # (any other close would have been written by now)
    [left] = await harness.engine.elicitations.pending(harness.world)
    assert left["tool_calls"][0]["id"] == "elicitation_1_call_a_2"


async def test_a_pending_question_is_in_the_snapshot_until_it_is_answered(harness: Harness) -> None:
    """A client that connects after the question was asked sees it in its snapshot (before, it saw nothing
    until the next event), listed from the same open items the page lists, like a pending approval."""
    question = await _asked(harness)
    [entry] = (await harness.engine.snapshot(harness.world))["pending_elicitations"]
    assert entry == {"id": question["tool_calls"][0]["id"], "seq": question["seq"], "ts": question["ts"],
                     "agent": "alice", "chat": question["chat"], "request": question["elicitation"],
                     "message": question}
    assert [q["id"] for q in await harness.engine.pending_questions(harness.world)] == [question["id"]]  # the page's
    await _answer(harness, question, {"action": "decline"})
    assert (await harness.engine.snapshot(harness.world))["pending_elicitations"] == []
    await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book", timeout=15)


async def test_a_pending_question_is_redacted_in_the_snapshot_and_on_the_page(harness: Harness) -> None:
    await harness.make_world("alice")
    secret = "sk-proj-" + "Q7v2Lm9Xc4Rt8Wz1Kp6Jd3Hs"
    question = {"kind": "message", "id": vocab.new_id("msg"), "chat": "main", "agent": "alice", "sender": "server",
                "role": "assistant", "content": None,
                "elicitation": {"toolCallId": "call_s", "toolName": "t__book", "requestedSchema": {},
                                "message": f"Is {secret} the key to use?"},
                "tool_calls": [{"id": "elicitation_call_s", "type": "function",
                                "function": {"name": "client.elicit", "arguments": json.dumps({"message": secret})}}]}
    await harness.engine.store.append(harness.world, question, [Open("elicitation:elicitation_call_s")])
    [shown] = await harness.engine.pending_questions(harness.world)  # what the page renders (it was not redacted)
    assert shown["elicitation"]["message"] == "Is [redacted] the key to use?" and secret not in json.dumps(shown)
    [entry] = (await harness.engine.snapshot(harness.world))["pending_elicitations"]
    assert entry["request"]["message"] == "Is [redacted] the key to use?" and entry["message"]["redacted"] is True
    assert secret not in json.dumps(entry) and entry["id"] == "elicitation_call_s"


async def test_stopping_a_call_closes_its_open_question(harness: Harness) -> None:
    question = await _asked(harness)
    assert await harness.engine.cancel_tool(harness.world, OWNER, "alice")
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")), timeout=10)
    assert closed["tool_call_id"] == question["tool_calls"][0]["id"]
    assert closed["elicitation_answer"] == {"action": "cancel", "reason": "interrupted"}
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book", timeout=10)
    assert "stopped" in result["content"]
    assert await harness.engine.elicitations.pending(harness.world) == []


def test_only_the_flat_schema_subset_is_put_to_people_and_answers_are_bounded() -> None:
    nested = {"type": "object", "properties": {"address": {"type": "object", "properties": {}}}}
    huge = {"type": "object", "properties": {"pick": {"type": "string", "enum": ["x" * 100] * 1000}}}
    for schema in (nested, huge, {"type": "array"}, {"properties": {"a": {"type": "string", "format": "ipv4"}}},
                   {"properties": {"a": {"type": "string"}}, "required": ["b"]}):
        with pytest.raises(ValueError):
            check_schema(schema)
    schema = check_schema({"type": "object", "properties": {"note": {"type": "string"}}})
    assert check_answer(schema, {"action": "accept", "content": {"note": "ok"}}) == {
        "action": "accept", "content": {"note": "ok"}}
    with pytest.raises(ValueError, match="at most 10000"):
        check_answer(schema, {"action": "accept", "content": {"note": "x" * 10_001}})
    with pytest.raises(ValueError, match="unknown field 'other'"):
        check_answer(schema, {"action": "accept", "content": {"other": 1}})
    assert check_answer(schema, {"action": "cancel", "content": {"ignored": True}}) == {"action": "cancel"}


async def test_a_timeout_the_log_refused_once_still_closes_the_question(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The question timed out, and its closing answer could not be written (a full disk, Redis gone a
    moment): the error went to the MCP server, and the question stayed in the queue for good."""
    await harness.make_world("alice", approval_timeout=1, mcp_servers=[
        {"name": "t", "command": sys.executable, "args": [TROUBLE], "tools": {"book": {"approval": "never"}}}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__book", {}))))
    refused = log_refuses_once(harness, monkeypatch, lambda e: bool(e.get("elicitation_answer")))
    await harness.say("book")
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book", timeout=15)
    assert refused and result["content"] == "not booked: cancel"
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")), timeout=10)
    assert closed["elicitation_answer"] == {"action": "cancel", "reason": "timeout"}
    assert await harness.engine.elicitations.pending(harness.world) == []


async def test_a_stop_whose_closing_answer_the_log_refused_once_still_closes_the_question(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The call was stopped while its question was pending, and the question's closing answer could not be
    written: the error was swallowed, and the question stayed in the queue for good."""
    question = await _asked(harness)
    refused = log_refuses_once(harness, monkeypatch, lambda e: bool(e.get("elicitation_answer")))
    assert await harness.engine.cancel_tool(harness.world, OWNER, "alice")
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")), timeout=10)
    assert refused and closed["tool_call_id"] == question["tool_calls"][0]["id"]
    assert closed["elicitation_answer"] == {"action": "cancel", "reason": "interrupted"}
    assert await harness.engine.elicitations.pending(harness.world) == []


async def test_a_question_closed_for_nobody_during_an_outage_is_not_answered_by_a_person_after_it(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    await harness.make_world("alice", approval_timeout=1, mcp_servers=[
        {"name": "t", "command": sys.executable, "args": [TROUBLE], "tools": {"book": {"approval": "never"}}}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__book", {}))))
    # The log is down (Redis gone a few seconds) from the server's closing answer until `back` is set.
    log, back = harness.engine.store.log, asyncio.Event()
    refused: list[vocab.Event] = []
    append_batch = log.append_batch

    async def outage(world: str, items: Any) -> list[vocab.Event]:
        if not back.is_set() and (refused or any(e.get("elicitation_answer") for e, _ in items)):
            refused.extend(e for e, _ in items)
            raise StorageError("database or disk is full")
        return await append_batch(world, items)
    monkeypatch.setattr(log, "append_batch", outage)
    await harness.say("book")
    [question] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    for _ in range(150):  # until the server's closing answer ("cancel" after the timeout) was refused
        if any(e.get("elicitation_answer") for e in refused):
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # the outage goes on a little (shorter than the first retry's delay)
    back.set()  # the log is back; a person answers the question still in the queue
    try:
        await _answer(harness, question, {"action": "accept", "content": {"guests": 2, "email": "a@b.co"}})
    except AppError as exc:
        assert exc.code == vocab.ALREADY_DECIDED
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")), timeout=10)
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book", timeout=15)
    # The record says what the MCP server got.
    if closed["elicitation_answer"]["action"] == "accept":
        assert result["content"].startswith("booked for 2"), result["content"]
    else:
        assert result["content"] == "not booked: cancel"



async def test_a_waiter_cut_off_again_and_again_keeps_one_subscription_of_its_own() -> None:
    """Each cut-off subscription holds the 1,000 frames it fell behind by: the waiter lets it go when it
    subscribes again, not only when the question is answered (up to its timeout, 10 minutes later)."""
    from types import SimpleNamespace

    from server.bus.memory import MemoryBackend
    from server.engine.approvals.elicitations import Elicitations
    from server.engine.store import channel

    bus = Bus(MemoryBackend())
    await bus.connect()
    elicitations = Elicitations(SimpleNamespace(bus=bus, observers=[]), None, None)  # type: ignore[arg-type]

    async def nothing_recorded(world: str, request: Any) -> None:
        return None
    elicitations._recorded_answer = nothing_recorded  # type: ignore[method-assign]
    request = {"tool_calls": [{"id": "elicitation_1_call_x"}], "seq": 1}
    answered: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    name = channel("w")
    try:
        async with bus.subscribe(name) as sub:
            listener = asyncio.ensure_future(elicitations._hear(sub, "w", request, answered))
            for _ in range(3):  # three bursts, each more than a subscription's queue
                for i in range(1001):
                    bus.deliver_here(name, f'{{"type":"chunk","message_id":"m","delta":"x","index":{i}}}')
                await asyncio.sleep(0.05)
            assert bus.subscriber_count(name) == 2  # the call's (cut off long ago) and the waiter's current one
            bus.deliver_here(name, json.dumps({"type": "event", "event": {
                "tool_call_id": "elicitation_1_call_x", "elicitation_answer": {"action": "decline"}}}))
            assert await asyncio.wait_for(answered, 5) == {"action": "decline"}
            await asyncio.wait_for(listener, 5)
            assert bus.subscriber_count(name) == 1
        async with bus.subscribe(name) as sub:
            listener = asyncio.ensure_future(elicitations._hear(sub, "w", request, asyncio.Future()))
            for _ in range(2):
                for i in range(1001):
                    bus.deliver_here(name, f'{{"type":"chunk","message_id":"m","delta":"x","index":{i}}}')
                await asyncio.sleep(0.05)
            listener.cancel()  # the question timed out: its waiter's subscriptions go with it
            await asyncio.gather(listener, return_exceptions=True)
            assert bus.subscriber_count(name) == 1
        assert bus.subscriber_count(name) == 0
    finally:
        await bus.disconnect()
