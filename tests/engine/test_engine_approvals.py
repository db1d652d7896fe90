"""The approval flow through the engine's public API, with the OpenAI double as the LLM."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.engine.hosting.hosted import WORLDS_CHANNEL
from server.errors import AppError
from server.log.failures import StorageError
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.engine import (
    MEMBER,
    OWNER,
    Harness,
    bus_refuses_once,
    log_refuses,
    log_refuses_once,
    open_engine,
    reply_by_turn,
    run_on_request,
    tool_calls,
)
from tests.fixtures.eventually import eventually_async


def _counter_command(harness: Harness) -> str:
    return "echo run >> count.txt"


async def _count_runs(harness: Harness) -> int:
    path = harness.engine.workspace_for(harness.world) / "count.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_approve_once_runs_the_tool_and_the_agent_carries_on(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo hi"}))))
    await harness.say("please run it")
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["toolName"] == "shell_exec"
    assert pending["request"]["toolArguments"] == {"command": "echo hi"}
    assert pending["request"]["options"] == list(vocab.APPROVAL_OPTIONS)
    await harness.decide(pending["id"], "approve", "once")
    [final] = await harness.wait_for(
        lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"))
    assert '"exit_code": 0' in final["content"] or '"exit_code":0' in final["content"]
    await harness.idle()
    assert await harness.engine.pending_approvals(harness.world) == []


async def test_deny_with_reason_tells_the_llm_and_runs_nothing(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("count")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"], "deny", reason="not on a Sunday")
    await harness.idle()
    last_request = harness.double.requests[-1].body["messages"]
    tool_message = next(m for m in last_request if m["role"] == "tool")
    assert json.loads(tool_message["content"]) == {"error": "denied by max", "reason": "not on a Sunday"}
    assert await _count_runs(harness) == 0


async def test_the_llm_never_receives_client_calls(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "true"}))))
    await harness.say("go")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"])
    await harness.idle()
    assert len(harness.double.requests) == 2
    for request in harness.double.requests:
        assert "client." not in json.dumps(request.body)
        assert "approval_" not in json.dumps(request.body)
    # ... while storage keeps all of it
    stored = json.dumps(await harness.events())
    assert vocab.REQUEST_APPROVAL in stored


async def test_session_approval_lets_the_next_call_in_the_chat_run_without_asking(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo again"})),
                                              after_tools=Text("ok")))
    await harness.say("first")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"], "approve", "session")
    await harness.idle()
    await harness.say("second")
    await harness.idle()
    assert len(await harness.results()) == 2
    assert len(await harness.engine.pending_approvals(harness.world)) == 0
    # a new chat ends the session grant
    chat = await harness.engine.worlds.create_chat(harness.world, OWNER, "fresh")
    await harness.say("third", chat=chat["id"])
    await harness.wait_pending(1)


async def test_always_rule_with_a_pattern_only_covers_matching_arguments(harness: Harness) -> None:
    await harness.make_world("alice")
    commands = iter(["git status", "git status --short", "rm -rf tmp"])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": next(commands)})),
                                              after_tools=Text("ok")))
    await harness.say("one")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"], "approve", "always", match={"command": "git status*"})
    await harness.idle()
    [rule] = await harness.engine.approvals.rules(harness.world)
    assert rule["rule"]["match"] == {"command": "git status*"}
    await harness.say("two")
    await harness.idle()
    assert len(await harness.results()) == 2
    await harness.say("three")
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["toolArguments"] == {"command": "rm -rf tmp"}


async def test_an_always_rule_never_allows_an_argument_the_approved_call_did_not_have(harness: Harness) -> None:
    # As the page confirms it: "these globs match only this exact call". A flag the call did not
    # have (an MCP tool's `recursive`, the shell's `timeout`) is not part of what was approved.
    await harness.make_world("alice")
    calls: Iterator[dict[str, Any]] = iter([{"command": "git status"}, {"command": "git status", "timeout": 60},
                  {"command": "git log"}, {"command": "git log", "timeout": 5}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", next(calls))), after_tools=Text("ok")))
    await harness.say("one")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"], "approve", "always", match={"command": "git status"})
    await harness.idle()
    await harness.say("two")
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["toolArguments"] == {"command": "git status", "timeout": 60}
    # An emptied glob allows any value of its argument, or none.
    await harness.decide(pending["id"], "approve", "always", match={"command": "git *", "timeout": ""})
    await harness.idle()
    for say in ("three", "four"):
        await harness.say(say)
        await harness.idle()
    assert len(await harness.results()) == 4
    assert not await harness.engine.pending_approvals(harness.world)


async def test_parallel_calls_with_decisions_in_any_order(harness: Harness) -> None:
    await harness.make_world("alice")
    (harness.engine.workspace_for(harness.world) / "notes.md").write_text("hello notes")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(
        ("file_read", {"path": "notes.md"}),
        ("shell_exec", {"command": "echo A"}),
        ("shell_exec", {"command": "echo B"}))))
    await harness.say("do three things")
    first, second = await harness.wait_pending(2)
    # the read-only call ran at once, without waiting for anyone
    await harness.wait_for(lambda e: e.get("role") == "tool" and "hello notes" in (e.get("content") or ""))
    await harness.decide(second["id"], "approve")
    await harness.wait_for(lambda e: e.get("role") == "tool" and "B" in (e.get("content") or "")
                           and not e.get("decision"))
    await asyncio.sleep(0.1)
    assert len(harness.double.requests) == 1, "the agent must wait for every call of its message"
    await harness.decide(first["id"], "deny", reason="no A")
    await harness.idle()
    messages = harness.double.requests[-1].body["messages"]
    assistant_index = next(i for i, m in enumerate(messages) if m.get("tool_calls"))
    results = messages[assistant_index + 1:assistant_index + 4]
    assert [m["role"] for m in results] == ["tool"] * 3
    assert {m["tool_call_id"] for m in results} == {c["id"] for c in messages[assistant_index]["tool_calls"]}


async def test_hundred_concurrent_duplicate_decisions_apply_once_and_run_once(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("count once")
    [pending] = await harness.wait_pending(1)
    outcomes = await asyncio.gather(*(harness.decide(pending["id"], "approve") for _ in range(100)),
                                    return_exceptions=True)
    applied = [o for o in outcomes if isinstance(o, dict)]
    refused = [o for o in outcomes if not isinstance(o, dict)]
    assert len(applied) == 1
    assert {getattr(r, "code", None) for r in refused} == {vocab.ALREADY_DECIDED}
    await harness.idle()
    assert await _count_runs(harness) == 1
    started = [e for e in await harness.events() if vocab.started_by(e)]
    assert len(started) == 1


async def test_an_approval_times_out_closed(harness: Harness) -> None:
    await harness.make_world("alice", approval_timeout=0.3)
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("count")
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["expiresAt"] is not None
    await harness.idle(timeout=5)
    assert await harness.engine.pending_approvals(harness.world) == []
    tool_message = next(m for m in harness.double.requests[-1].body["messages"] if m["role"] == "tool")
    assert json.loads(tool_message["content"])["error"] == "approval timed out"
    assert await _count_runs(harness) == 0
    [result] = [e for e in await harness.events() if e.get("role") == "tool" and not e.get("decision")]
    assert result["not_run"] == "timed_out"  # what clients read to say "timed out", never "ran"


async def test_cancelling_an_agents_approvals_denies_them(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": "a"}), ("file_write", {"path": "x", "content": "y"}))))
    await harness.say("go")
    await harness.wait_pending(2)
    assert await harness.engine.approvals.cancel(harness.world, MEMBER, "alice") == 2
    await harness.idle()
    assert await harness.engine.pending_approvals(harness.world) == []


async def test_racing_starts_of_one_call_never_report_it_interrupted(harness: Harness) -> None:
    from server.engine.calls.refs import CallRef
    from server.engine.turns.runner import INTERRUPTED

    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "sleep 0.5; echo done"}))))
    await harness.say("go")
    [pending] = await harness.wait_pending(1)
    decision = await harness.decide(pending["id"])
    origin = await harness.engine.store.log.get_open(harness.world, vocab.call_key(pending["request"]["toolCallId"]))
    assert origin is not None
    call = CallRef.find(origin, pending["request"]["toolCallId"])
    assert call is not None
    # the runner and other processes may try to carry out the same decision: all but one lose the claim
    await asyncio.gather(*(harness.engine.approvals.carry_out(call, decision) for _ in range(20)))
    harness.engine.wake_agents(harness.world)
    await harness.idle()
    result = (await harness.results())[call.id]
    assert INTERRUPTED not in result["content"] and "done" in result["content"]
    assert len([e for e in await harness.events() if vocab.started_by(e)]) == 1


async def test_a_step_that_read_memory_before_the_result_never_runs_the_call_again(harness: Harness) -> None:
    """The race CI caught in the browser: a runner woken while an approved call ran read the chat's
    memory before the result was written, and looked at the call only after it had finished. The call
    was no longer busy and its `began` mark was gone, so it was taken for one that never began, and
    ran a second time. What the log says now (its result) must win over the stale memory."""
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("go")
    [pending] = await harness.wait_pending(1)
    chat = pending["chat"]
    runner = harness.engine.hosting.hosted[harness.world].runners["alice"]  # the race needs one step driven by hand
    stale = list(await runner.memory(chat))  # a copy: the call is unanswered in it
    await harness.decide(pending["id"])
    await harness.idle()
    assert await _count_runs(harness) == 1
    await runner._step(chat, stale)
    await harness.idle()
    assert await _count_runs(harness) == 1, "the finished call ran again"
    assert len([e for e in await harness.events() if vocab.started_by(e)]) == 1


async def test_an_approved_call_whose_began_mark_the_log_refused_runs_once_the_log_takes_it(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log refused the `began` write just before the tool (a full disk, Redis gone a moment): the
    call stayed busy in this process for good, never ran nor was reported, and the agent hung."""
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("go")
    [pending] = await harness.wait_pending(1)
    log = harness.engine.store.log
    refused: list[str] = []
    take = log.lease

    async def refusing_once(name: str, holder: str, ttl: float, **where: Any) -> int:
        if name.startswith("began:") and not refused:
            refused.append(name)
            raise StorageError("database or disk is full")
        return await take(name, holder, ttl, **where)
    monkeypatch.setattr(log, "lease", refusing_once)
    await harness.decide(pending["id"])
    await harness.wait_for(lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"),
                           timeout=15)
    assert refused and await _count_runs(harness) == 1


def _denial_result(event: vocab.Event) -> bool:
    return event.get("role") == "tool" and not event.get("decision") and "error" in str(event.get("content"))


async def test_a_denial_whose_result_the_log_refused_is_answered_once_the_log_takes_it(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The denial was stored but its result (written after it) was refused: the call stayed unanswered,
    nothing woke the agent (a decision is carried out by whoever wrote it), and it hung."""
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("count")
    [pending] = await harness.wait_pending(1)
    refused = log_refuses_once(harness, monkeypatch, _denial_result)
    with pytest.raises(StorageError):
        await harness.decide(pending["id"], "deny")
    assert refused
    await harness.wait_for(lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"),
                           timeout=10)
    assert len([e for e in await harness.events() if _denial_result(e)]) == 1
    assert await _count_runs(harness) == 0


async def test_an_approval_timeout_the_log_refused_once_still_closes_the_request(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeout's denial could not be written when it fired: it was logged and dropped, and the
    request stayed pending for good (nothing armed its deadline again in this process)."""
    await harness.make_world("alice", approval_timeout=0.3)
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    refused = log_refuses_once(harness, monkeypatch, lambda e: bool((e.get("decision") or {}).get("timeout")))
    await harness.say("count")
    await harness.wait_pending(1)
    await harness.idle(timeout=10)
    assert refused and await harness.engine.pending_approvals(harness.world) == []
    tool_message = next(m for m in harness.double.requests[-1].body["messages"] if m["role"] == "tool")
    assert json.loads(tool_message["content"])["error"] == "approval timed out"


async def test_an_approval_whose_event_the_bus_missed_still_runs_its_call(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision (which starts the call) was stored, then publishing it failed (Redis dropped the
    connection): the executor never launched the claimed call, nothing woke the agent, and it hung."""
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("count")
    [pending] = await harness.wait_pending(1)
    missed = bus_refuses_once(harness.engine, monkeypatch, lambda message: '"decision"' in message)
    try:
        await harness.decide(pending["id"])
    except ConnectionError:
        pass  # the client may be told of the bus's trouble; the decision is stored all the same
    assert missed
    await harness.wait_for(lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"),
                           timeout=10)
    assert await _count_runs(harness) == 1


async def test_a_tool_result_whose_event_the_bus_missed_still_wakes_the_agent(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool's result was stored, then publishing it failed (Redis dropped the connection): the
    result is what wakes the agent, and nothing else did, so it hung with its call answered."""
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("count")
    [pending] = await harness.wait_pending(1)
    missed = bus_refuses_once(harness.engine, monkeypatch,
                             lambda message: '"role":"tool"' in message and '"decision"' not in message)
    await harness.decide(pending["id"])
    await harness.wait_for(lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"),
                           timeout=10)
    assert missed and await _count_runs(harness) == 1


async def test_a_waiting_status_the_bus_missed_leaves_the_turn_to_go_on(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply and its approval request were stored, then publishing the agent's "waiting" status
    failed: the step ended the turn with an internal error while its call was still pending, so the
    call's result, once approved and run, never reached the LLM."""
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    missed = bus_refuses_once(harness.engine, monkeypatch,
                              lambda message: f'"state":"{vocab.WAITING_APPROVAL}"' in message)
    await harness.say("count")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"])
    await harness.wait_for(lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"),
                           timeout=10)
    assert missed and await _count_runs(harness) == 1
    assert not [e for e in await harness.events() if e.get("kind") == vocab.AGENT_ERROR]


async def test_a_rule_whose_decision_the_log_refused_once_decides_every_covered_request_and_is_added_once(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule was stored, then deciding the first pending request it covers was refused (a full disk,
    Redis gone a moment): the client got the error, the other requests it covers stayed pending, and
    the client's retry added the same rule a second time."""
    await harness.make_world("alice")
    count = ("shell_exec", {"command": _counter_command(harness)})
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(count, count)))
    await harness.say("count twice")
    await harness.wait_pending(2)
    refused = log_refuses_once(harness, monkeypatch, lambda e: bool(e.get("decision")))
    try:
        await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, "allow")
    except StorageError:  # a 503: the client tries again
        await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, "allow")
    assert refused
    await harness.wait_for(lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"),
                           timeout=10)
    assert await harness.engine.pending_approvals(harness.world) == [] and await _count_runs(harness) == 2
    assert len(await harness.engine.rules(harness.world)) == 1


async def test_a_world_whose_announcement_the_bus_missed_is_made_whole_and_announced_again(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The world was stored and hosted here, then announcing it to other processes failed (Redis
    dropped the connection): the creator got an error, and the agents it asked for were never added.
    Then the announcement was dropped: a process that stayed connected never hosted the world."""
    bus = harness.engine.store.bus
    backend = bus.backend
    missed: list[str] = []
    publish = backend.publish

    async def failing_once(channel: str, message: str) -> None:
        if not missed and channel == WORLDS_CHANNEL:
            missed.append(message)
            raise StorageError("cannot publish to Redis: Error 104 while writing to socket. Connection reset by peer.")
        await publish(channel, message)
    monkeypatch.setattr(backend, "publish", failing_once)
    async with bus.subscribe(WORLDS_CHANNEL) as news:
        world = await harness.make_world("alice")
        assert missed == [world]
        assert [a["name"] for a in (await harness.engine.get_world(world))["agents"]] == ["alice"]
        async with asyncio.timeout(5):
            assert await news.get() == world


@pytest.mark.parametrize("allowed", ["before", "after"])
async def test_a_restart_never_approves_a_pending_request_by_the_rules_as_they_are_now(
        tmp_path: Path, llm_double: OpenAIDouble, allowed: str) -> None:
    """A request asked under an "ask" rule stays for a person after the rule is revoked, live and
    after a restart: hosting the world again never approves it by the rules as they are now (a review
    found a first version applying them again, which approved such a request without anyone). An
    allow rule added `after` the request, while the "ask" rule still stood, left it to people then:
    the rules then and now disagree, so it is not decided after the restart either."""
    engine, close = await open_engine(tmp_path)
    try:
        harness = Harness(engine, llm_double)
        await harness.make_world("alice")
        if allowed == "before":
            await engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, "allow")
        asking = await engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "echo *"}, "ask")
        harness.double.respond_with(reply_by_turn(
            lambda: tool_calls(("shell_exec", {"command": "echo run >> count.txt"}))))
        await harness.say("count")
        await harness.wait_pending(1)
        if allowed == "after":
            await engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, "allow")
        await engine.approvals.revoke_rule(harness.world, OWNER, asking["id"])
        assert len(await engine.pending_approvals(harness.world)) == 1
    finally:
        await close()
    engine, close = await open_engine(tmp_path)
    try:
        harness = Harness(engine, llm_double, world=harness.world, agents=["alice"])
        await asyncio.sleep(0.5)  # hosted (and resumed) within open_engine; nothing may follow either
        assert len(await engine.pending_approvals(harness.world)) == 1 and await _count_runs(harness) == 0
    finally:
        await close()



async def test_a_new_rule_decides_only_the_requests_it_covers_not_those_left_to_people_before(
        harness: Harness) -> None:
    """A request asked under an "ask" rule beside an allow rule stays for a person once the "ask" rule is
    revoked (test above); adding an unrelated rule later approved it, by the rules as they then were:
    a new rule or grant decides the pending requests it decides itself, nothing else."""
    await harness.make_world("alice")
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, "allow")
    asking = await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "echo *"}, "ask")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo run >> count.txt"}))))
    await harness.say("count")
    await harness.wait_pending(1)
    await harness.engine.approvals.revoke_rule(harness.world, OWNER, asking["id"])
    await harness.engine.approvals.add_rule(harness.world, OWNER, "file_write", None, "deny")
    await asyncio.sleep(0.3)
    assert len(await harness.engine.pending_approvals(harness.world)) == 1 and await _count_runs(harness) == 0

def _decisions(events: list[vocab.Event]) -> list[vocab.Event]:
    return [e for e in events if e.get("decision")]


async def _a_rule_cut_short_by_a_restart(tmp_path: Path, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch,
                                         effect: str, then: Any = None) -> tuple[Harness, Any]:
    """A request is pending; a rule with `effect` covering it is added while the log refuses decisions,
    so the rule is stored and its decision left to a background retry, which the engine's close cuts
    short; `then(engine, world, rule)` runs before that close. Returns the harness of the engine opened
    again (which hosted the world) and its closer."""
    engine, close = await open_engine(tmp_path)
    try:
        harness = Harness(engine, llm_double)
        await harness.make_world("alice")
        harness.double.respond_with(reply_by_turn(
            lambda: tool_calls(("shell_exec", {"command": "echo run >> count.txt"}))))
        await harness.say("count")
        await harness.wait_pending(1)
        log_refuses(engine, monkeypatch, lambda e: bool(e.get("decision")))
        rule = await engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, effect)
        assert len(await engine.pending_approvals(harness.world)) == 1
        if then is not None:
            await then(engine, harness.world, rule)
    finally:
        await close()
    monkeypatch.undo()
    engine, close = await open_engine(tmp_path)
    return Harness(engine, llm_double, world=harness.world, agents=["alice"]), close


async def test_a_rule_whose_decisions_a_restart_cut_short_decides_its_requests_once_hosted_again(
        tmp_path: Path, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """An allow rule added while a request waited is stored, but the log refused its decision and the
    server stopped before the retry: the request waited for a person for good (the rule's decisions
    lived only in that process's retry)."""
    harness, close = await _a_rule_cut_short_by_a_restart(tmp_path, llm_double, monkeypatch, "allow")
    try:
        await harness.wait_for(lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"),
                               timeout=15)
        assert await harness.engine.pending_approvals(harness.world) == [] and await _count_runs(harness) == 1
        [decision] = _decisions(await harness.events())
        assert decision["decision"]["policy"]["verdict"] == "allow" and decision["decision"]["policy"]["rule_id"]
    finally:
        await close()


async def test_a_deny_rule_cut_short_by_a_restart_denies_once_hosted_again(
        tmp_path: Path, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    harness, close = await _a_rule_cut_short_by_a_restart(tmp_path, llm_double, monkeypatch, "deny")
    try:
        await harness.wait_for(lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"),
                               timeout=15)
        assert await harness.engine.pending_approvals(harness.world) == [] and await _count_runs(harness) == 0
    finally:
        await close()


async def test_a_rule_revoked_before_the_restart_decides_nothing_after_it(
        tmp_path: Path, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """The allow rule whose decision was cut short was revoked before the restart: as the retry would
    then have, the request stays for a person."""
    async def revoke(engine: Any, world: str, rule: dict[str, Any]) -> None:
        await engine.approvals.revoke_rule(world, OWNER, rule["id"])
    harness, close = await _a_rule_cut_short_by_a_restart(tmp_path, llm_double, monkeypatch, "allow", revoke)
    try:
        await asyncio.sleep(0.5)  # hosted (and resumed) within open_engine; nothing may follow
        assert len(await harness.engine.pending_approvals(harness.world)) == 1 and await _count_runs(harness) == 0
    finally:
        await close()


async def test_a_removed_agents_pending_request_neither_stops_a_restart_nor_a_new_rule(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    """Removing an agent leaves its requests pending; deciding what the rules cover skips them (its
    tools are gone) rather than fail: the engine starts again, and a rule added later is stored and applied."""
    engine, close = await open_engine(tmp_path)
    try:
        harness = Harness(engine, llm_double)
        await harness.make_world("alice", "bob")
        harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo hi"}))))
        await harness.say("@alice go")
        [pending] = await harness.wait_pending(1)
        await engine.remove_agent(harness.world, OWNER, pending["agent"])
    finally:
        await close()
    engine, close = await open_engine(tmp_path)  # a first version failed here, hosting the world
    try:
        assert engine.hosts(harness.world)
        await engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, "allow")
        assert [p["id"] for p in await engine.pending_approvals(harness.world)] == [pending["id"]]
    finally:
        await close()


@pytest.mark.parametrize("gone", ["agent removed", "tool not allowed"])
async def test_a_restart_never_approves_what_a_rule_left_pending_while_its_agent_or_tool_was_gone(
        tmp_path: Path, llm_double: OpenAIDouble, gone: str) -> None:
    """An allow rule added while the request's agent was removed (or its tool not allowed to it) leaves
    the request for a person, live; the agent (or its tool) coming back decides nothing live either.
    Hosting the world again must not approve it: the rules then, replayed with the agent's tools as
    they are now, are not what the live path saw."""
    engine, close = await open_engine(tmp_path)
    try:
        harness = Harness(engine, llm_double)
        await harness.make_world("alice")
        harness.double.respond_with(reply_by_turn(
            lambda: tool_calls(("shell_exec", {"command": "echo run >> count.txt"}))))
        await harness.say("count")
        [pending] = await harness.wait_pending(1)
        config = {"name": "alice", "provider": "openai", "model": "test-model", "base_url": llm_double.base_url}
        if gone == "agent removed":
            await engine.remove_agent(harness.world, OWNER, "alice")
        else:
            await engine.update_agent(harness.world, OWNER, "alice", {"tools": ["file_read"]})
        await engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, "allow")
        assert [p["id"] for p in await engine.pending_approvals(harness.world)] == [pending["id"]]  # live: left
        if gone == "agent removed":
            await engine.add_agent(harness.world, OWNER, config)
        else:
            await engine.update_agent(harness.world, OWNER, "alice", {"tools": None})
        await asyncio.sleep(0.2)
        assert [p["id"] for p in await engine.pending_approvals(harness.world)] == [pending["id"]]  # still, live
    finally:
        await close()
    engine, close = await open_engine(tmp_path)
    try:
        await asyncio.sleep(0.5)
        assert [p["id"] for p in await engine.pending_approvals(harness.world)] == [pending["id"]]
        assert await _count_runs(Harness(engine, llm_double, world=harness.world)) == 0
    finally:
        await close()


async def test_hosting_judges_a_pending_request_again_only_when_the_rules_of_its_tool_changed(
        tmp_path: Path, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replaying a long trail of rules for other tools judges a pending request once, not once per rule:
    judging every request at every addition against every rule held the event loop for
    (requests x additions x rules) while hosting (50 requests, 2000 rules: 25 s without a tick)."""
    engine, close = await open_engine(tmp_path)
    try:
        harness = Harness(engine, llm_double)
        await harness.make_world("alice")
        harness.double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo x"}))))
        await harness.say("go")
        [pending] = await harness.wait_pending(1)
        for i in range(60):
            await engine.approvals.add_rule(harness.world, OWNER, f"other_tool_{i}", None, "allow")
        judged = 0
        verdict = engine.approvals._verdict

        async def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal judged
            judged += 1
            return await verdict(*args, **kwargs)
        monkeypatch.setattr(engine.approvals, "_verdict", counting)
        await engine.approvals.resume(harness.world, [pending["message"]])
        assert judged <= 2
        assert [p["id"] for p in await engine.pending_approvals(harness.world)] == [pending["id"]]
    finally:
        await close()


async def test_an_engine_starts_while_the_log_still_refuses_the_decisions_a_restart_cut_short(
        tmp_path: Path, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk that refused a rule's decision is still full at the restart: the engine must start (and
    serve what it can), the decision left to later, not fail its start on the hosting's write."""
    from server.log.sqlite import SqliteLog
    engine, close = await open_engine(tmp_path)
    try:
        harness = Harness(engine, llm_double)
        await harness.make_world("alice")
        harness.double.respond_with(reply_by_turn(
            lambda: tool_calls(("shell_exec", {"command": "echo run >> count.txt"}))))
        await harness.say("count")
        await harness.wait_pending(1)
        log_refuses(engine, monkeypatch, lambda e: bool(e.get("decision")))
        await engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, "allow")
        assert len(await engine.pending_approvals(harness.world)) == 1
    finally:
        await close()
    monkeypatch.undo()
    append_batch = SqliteLog.append_batch

    async def refusing(self: Any, world: str, items: Any) -> list[vocab.Event]:
        if any(event.get("decision") for event, _ in items):
            raise StorageError("database or disk is full")
        return await append_batch(self, world, items)
    monkeypatch.setattr(SqliteLog, "append_batch", refusing)
    engine, close = await asyncio.wait_for(open_engine(tmp_path), 10)  # raised StorageError before
    try:
        assert engine.hosts(harness.world)
        assert len(await engine.pending_approvals(harness.world)) == 1
    finally:
        await close()


@pytest.mark.parametrize("scope", ["always", "session"])
async def test_a_wider_approval_and_the_rule_it_asks_for_are_one_write(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, scope: str) -> None:
    """The decision was stored (and its call started), then the log refused the rule or grant it asked
    for: the person got an error, their retry found the request decided, and the rule was never added.
    Now both are one write: refused, nothing is decided, and the retry decides and remembers."""
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("count")
    [pending] = await harness.wait_pending(1)
    refused = log_refuses_once(harness, monkeypatch, lambda e: e.get("kind") in (vocab.RULE_ADDED, vocab.GRANT_ADDED))
    with pytest.raises(StorageError):
        await harness.decide(pending["id"], "approve", scope)
    assert refused and [p["id"] for p in await harness.engine.pending_approvals(harness.world)] == [pending["id"]]
    await harness.decide(pending["id"], "approve", scope)  # the person's retry
    await harness.wait_for(lambda e: e.get("role") == "assistant" and (e.get("content") or "").startswith("done"),
                           timeout=10)
    assert await _count_runs(harness) == 1
    remembered = await (harness.engine.rules(harness.world) if scope == "always"
                        else harness.engine.grants(harness.world))
    assert len(remembered) == 1

async def test_a_denial_s_rule_decides_the_pending_requests_it_covers_even_when_its_result_write_fails(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule a wider denial asks for is stored with the decision; when the denied call's result was then
    refused once (a full disk a moment), the pending requests the rule covers were left pending: the rule
    was in force, but never applied to them (until a restart)."""
    await harness.make_world("alice", "bob")
    harness.double.respond_with(run_on_request)
    await harness.say("@alice run echo a")
    await harness.say("@bob run echo b")
    first, _ = await harness.wait_pending(2)
    log_refuses_once(harness, monkeypatch, lambda e: e.get("role") == "tool" and not e.get("decision"))
    with pytest.raises(StorageError):
        await harness.decide(first["id"], "deny", "always")
    assert len(await harness.engine.rules(harness.world)) == 1
    await eventually_async(lambda: harness.engine.pending_approvals(harness.world), timeout=5, accept=lambda p: p == [])


async def test_a_call_that_finishes_while_the_runner_looks_is_never_shown_as_waiting_for_a_person(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner, woken while a tool ran, found it busy, and by the time it looked at the approvals the
    tool had finished: it showed the agent "waiting" for a client, which ended an AG-UI run before the
    agent's answer (test_agui's MCP question test failed so in two clean-clone runs of three)."""
    await harness.make_world("alice")
    def respond(body: dict[str, Any]) -> Any:
        said = [m.get("content") or "" for m in body["messages"] if m["role"] == "user"]
        if body["messages"][-1]["role"] == "tool" or "still there" in said[-1]:
            return Text("done")
        return tool_calls(("shell_exec", {"command": "sleep 0.3"}))
    harness.double.respond_with(respond)
    await harness.say("wait a moment")
    [pending] = await harness.wait_pending(1)
    executor, approvals = harness.engine.executor, harness.engine.approvals
    ask = approvals.pending

    async def after_the_tool(world: str, agent: str | None = None) -> list[vocab.Event]:
        if agent is not None:  # the runner's look, once its step found the call busy: the tool ends first
            for _ in range(200):  # (bounded: other callers wait at most 2 s)
                if not executor.running:
                    break
                await asyncio.sleep(0.01)
        return await ask(world, agent)
    monkeypatch.setattr(approvals, "pending", after_the_tool)
    statuses: list[dict[str, Any]] = []
    async with harness.engine.store.bus.subscribe(f"world:{harness.world}") as sub:
        async def collect() -> None:
            while True:
                frame = json.loads(await sub.get())
                if frame.get("type") == "status":
                    statuses.append(frame)
        collecting = asyncio.create_task(collect())
        try:
            await harness.decide(pending["id"])
            await asyncio.sleep(0.1)
            await harness.say("@alice still there?")  # wakes the runner while the tool runs
            await harness.wait_for(lambda e: e.get("role") == "assistant"
                                   and (e.get("content") or "").startswith("done"), timeout=10)
        finally:
            collecting.cancel()
    assert not [s for s in statuses if s.get("waiting_for") == "client"], statuses


@pytest.mark.parametrize("scope", ["always", "session"])
async def test_a_wider_decision_stored_without_its_answer_decides_the_requests_its_rule_covers(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, scope: str) -> None:
    """The log stored the decision with its rule or grant, but its answer was lost (Redis timed out after
    the write): the person got an error, their retry found the request decided, and the other pending
    requests the rule covers stayed pending until a restart."""
    await harness.make_world("alice")
    count = ("shell_exec", {"command": _counter_command(harness)})
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(count, count)))
    await harness.say("count twice")
    first, _ = await harness.wait_pending(2)
    log = harness.engine.store.log
    lost: list[list[vocab.Event]] = []
    append_batch = log.append_batch

    async def stored_but_timed_out_once(world: str, items: Any) -> list[vocab.Event]:
        stored = await append_batch(world, items)
        if not lost and any(e.get("kind") in (vocab.RULE_ADDED, vocab.GRANT_ADDED) for e, _ in items):
            lost.append(stored)
            raise StorageError("Timeout reading from socket", may_have_stored=True)
        return stored
    monkeypatch.setattr(log, "append_batch", stored_but_timed_out_once)
    with pytest.raises(StorageError):
        await harness.decide(first["id"], "deny", scope)
    with pytest.raises(AppError) as retried:  # the person's retry
        await harness.decide(first["id"], "deny", scope)
    assert lost and retried.value.code == vocab.ALREADY_DECIDED
    await eventually_async(lambda: harness.engine.pending_approvals(harness.world), timeout=5, accept=lambda p: p == [])
    assert await _count_runs(harness) == 0


@pytest.mark.parametrize("scope", ["always", "session"])
async def test_a_wider_denial_whose_write_was_not_stored_never_approves_the_request_it_denied(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, scope: str) -> None:
    """A request asked under an "ask" rule, revoked since, while an allow rule covers the tool: a person
    denies it for the whole world (or session), and the log fails the write in a way after which it may
    have stored it, but it did not. No rule was added, so nothing is decided from here: the request
    stays pending for the person's retry, and the call never runs (a review found a first version
    applying the rules as they are now, which approved the very request the person denied)."""
    engine = harness.engine
    await harness.make_world("alice")
    await engine.approvals.add_rule(harness.world, OWNER, "shell_exec", None, "allow")
    asking = await engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "echo *"}, "ask")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": _counter_command(harness)}))))
    await harness.say("count")
    [pending] = await harness.wait_pending(1)
    await engine.approvals.revoke_rule(harness.world, OWNER, asking["id"])
    log = engine.store.log

    async def times_out_before_storing(world: str, items: Any) -> list[vocab.Event]:
        raise StorageError("Timeout writing to socket", may_have_stored=True)
    monkeypatch.setattr(log, "append_batch", times_out_before_storing)
    with pytest.raises(StorageError):
        await harness.decide(pending["id"], "deny", scope)
    monkeypatch.undo()
    await asyncio.sleep(0.5)  # anything it started in the background had its time
    assert len(await engine.pending_approvals(harness.world)) == 1
    assert await _count_runs(harness) == 0
