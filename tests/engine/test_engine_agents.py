"""Agents talking: routing by mention, the turn limit, bad LLM replies and LLM failures."""
from __future__ import annotations

import json
from typing import Any

import pytest

from server import vocab
from server.engine.actors import Actor
from server.testing.openai_double import Responder, Response, Status, Text
from tests.fixtures.engine import Harness, reply_by_turn, tool_calls


def _by_agent(replies: dict[str, Response | Responder]) -> Responder:
    """Answer with the reply configured for whichever agent the system prompt names."""
    def respond(body: dict[str, Any]) -> Response | None:
        name = body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else ""
        reply = replies.get(name, Text("ok"))
        return reply(body) if callable(reply) else reply
    return respond


async def _world_with_prompts(harness: Harness, *names: str, **settings: object) -> None:
    await harness.make_world(*names, **settings)
    for name in names:
        await harness.engine.worlds.update_agent(harness.world, harness_owner(), name, {"system_prompt": name})


def harness_owner() -> Actor:
    from tests.fixtures.engine import OWNER
    return OWNER


async def test_a_message_without_mention_goes_to_every_agent(harness: Harness) -> None:
    await _world_with_prompts(harness, "alice", "bob")
    harness.double.respond_with(_by_agent({"alice": Text("alice here"), "bob": Text("bob here")}))
    await harness.say("hello all")
    await harness.idle()
    replies = {e["sender"]: e["content"] for e in await harness.events() if e.get("role") == "assistant"}
    assert replies == {"alice": "alice here", "bob": "bob here"}


async def test_a_mention_addresses_only_that_agent_and_agents_mention_each_other(harness: Harness) -> None:
    await _world_with_prompts(harness, "alice", "bob", "carol")
    harness.double.respond_with(_by_agent({"alice": Text("Sure.\n\n@bob please check"), "bob": Text("checked")}))
    await harness.say("@alice start please")
    await harness.idle()
    senders = [e["sender"] for e in await harness.events() if e.get("role") == "assistant"]
    assert senders == ["alice", "bob"]
    bob_request = next(r.body for r in harness.double.requests if r.body["messages"][0]["content"] == "bob")
    assert bob_request["messages"][-1] == {"role": "user", "name": "alice", "content": "Sure.\n\n@bob please check"}


async def test_leading_mentions_address_every_agent_they_name(harness: Harness) -> None:
    await _world_with_prompts(harness, "alice", "bob", "carol")
    harness.double.respond_with(_by_agent({"alice": Text("alice here"), "bob": Text("bob here")}))
    message = await harness.say("@alice @bob both of you, not @carol")
    await harness.idle()
    assert message["to"] == ["alice", "bob"]
    replies = sorted(e["sender"] for e in await harness.events() if e.get("role") == "assistant")
    assert replies == ["alice", "bob"]


async def test_the_turn_limit_stops_an_agent_loop_and_says_so(harness: Harness) -> None:
    await _world_with_prompts(harness, "alice", "bob", turn_limit=3)
    harness.double.respond_with(_by_agent({"alice": Text("@bob your turn"), "bob": Text("@alice no, yours")}))
    await harness.say("@alice begin")
    await harness.idle(timeout=10)
    events = await harness.events()
    senders = [e["sender"] for e in events if e.get("role") == "assistant"]
    assert senders == ["alice", "bob"] * 3  # three LLM calls each; then alice is stopped
    [notice] = [e for e in events if e["kind"] == vocab.NOTICE]
    assert notice["agent"] == "alice" and "turn limit" in notice["text"]


async def test_an_agent_never_answers_itself(harness: Harness) -> None:
    await _world_with_prompts(harness, "alice")
    harness.double.respond_with(_by_agent({"alice": Text("@alice I talk to myself")}))
    await harness.say("hi")
    await harness.idle()
    assert len(harness.double.requests) == 1


async def test_malformed_tool_arguments_go_back_to_the_llm_and_never_to_a_human(harness: Harness) -> None:
    await harness.make_world("alice")
    from server.testing.openai_double import ToolCalls
    harness.double.respond_with(reply_by_turn(ToolCalls([("call_bad1", "shell_exec", '{"command": ')]),
                                              after_tools=Text("sorry")))
    await harness.say("go")
    await harness.idle()
    assert await harness.engine.pending_approvals(harness.world) == []
    result = harness.double.requests[-1].body["messages"][-1]
    assert result["role"] == "tool" and "invalid arguments for shell_exec" in json.loads(result["content"])["error"]


async def test_an_unknown_tool_is_never_executed_and_is_audited(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("rm_everything", {}), ("client.requestApproval", {})),
                                              after_tools=Text("ok")))
    await harness.say("go")
    await harness.idle()
    rejected = [a for a in await harness.engine.audit(harness.world) if a["action"] == "tool_call_rejected"]
    assert {a["tool"] for a in rejected} == {"rm_everything", "client.requestApproval"}
    assert await harness.engine.pending_approvals(harness.world) == []


async def test_odd_or_repeated_model_call_ids_are_replaced_with_unique_plain_ones(harness: Harness) -> None:
    from server.testing.openai_double import ToolCalls
    await harness.make_world("alice")
    read = json.dumps({"path": "notes.md"})
    odd = ["approval_call_1", "has space", "x" * 101]  # one is shaped like an approval id
    harness.double.queue(ToolCalls([(odd[0], "file_read", read), (odd[1], "file_read", read),
                                    (odd[2], "file_read", read)]),
                         Text("first done"),
                         ToolCalls([("call_same", "file_read", read), ("call_same", "file_read", read)]), Text("done"))
    await harness.say("read it thrice")
    await harness.idle()
    await harness.say("and twice")
    await harness.idle()
    ids = [c["id"] for e in await harness.events() if e.get("sender") == "alice" for c in e.get("tool_calls") or ()]
    assert len(ids) == 5 and len(set(ids)) == 5
    assert not set(ids) & {*odd, "call_same"}
    assert all(vocab.SAFE_CALL_ID.match(i) for i in ids)
    results = [m for m in harness.double.requests[-1].body["messages"] if m["role"] == "tool"]
    assert {m["tool_call_id"] for m in results} <= set(ids) and len(results) == 5


async def test_a_failing_llm_is_retried_then_shown_as_an_error_and_the_world_stays_usable(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Status(500), Status(500), Status(500))
    await harness.say("hello?")
    await harness.idle(timeout=10)
    [error] = [e for e in await harness.events() if e["kind"] == vocab.AGENT_ERROR]
    assert "alice could not answer" in error["message"]
    assert len(harness.double.requests) == 3
    harness.double.respond_with(lambda body: Text("back again"))
    await harness.say("and now?")
    await harness.wait_for(lambda e: e.get("content") == "back again")


async def test_a_transient_failure_is_retried_transparently(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Status(503), Text("fine"))
    await harness.say("hello")
    await harness.wait_for(lambda e: e.get("content") == "fine")
    assert not [e for e in await harness.events() if e["kind"] == vocab.AGENT_ERROR]


async def test_the_bus_carries_tool_arguments_with_secrets_hidden_and_the_log_keeps_them(harness: Harness) -> None:
    from server.engine.store import channel
    await harness.make_world("alice")
    harness.double.respond_with(reply_by_turn(
        lambda: tool_calls(("file_read", {"path": "a.md", "auth_token": "tok-9b1"})), after_tools=Text("done")))
    frames: list[str] = []
    async with harness.engine.store.bus.subscribe(channel(harness.world)) as sub:
        await harness.say("read a.md")
        await harness.idle()
        while (frame := sub.get_nowait()) is not None:
            frames.append(frame)
    sent = [call for frame in frames for call in json.loads(frame).get("event", {}).get("tool_calls") or ()
            if call["function"]["name"] == "file_read"]
    assert [json.loads(call["function"]["arguments"]) for call in sent] == [
        {"path": "a.md", "auth_token": "[redacted]"}]
    assert not any("tok-9b1" in frame for frame in frames)
    stored = await harness.engine.store.log.read(harness.world, 0, 1000)
    assert any("tok-9b1" in call["function"]["arguments"] for e in stored for call in e.get("tool_calls") or ())


async def test_a_message_sent_while_the_agent_is_thinking_is_answered_too(harness: Harness) -> None:
    from server.testing.openai_double import Delay

    await harness.make_world("alice")
    harness.double.respond_with(lambda body: Delay(0.8, Text("first answer")) if len(harness.double.requests) == 1
                                else Text("second answer"))
    await harness.say("first question")
    await harness.double.wait_for_requests_async(1)
    await harness.say("second question, while she thinks")
    await harness.wait_for(lambda e: e.get("content") == "second answer", timeout=10)
    said = [m.get("content") for m in harness.double.requests[-1].body["messages"]]
    assert "second question, while she thinks" in said


async def test_agent_settings_reach_every_reader_redacted_and_an_edit_sending_them_back_keeps_them(
        harness: Harness) -> None:
    from tests.fixtures.engine import OWNER

    key = "sk-proj-" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0"
    url = "https://proxyuser:Hunter2Pass@llm.example.com/v1"
    await harness.make_world()
    engine, world = harness.engine, harness.world
    added = await engine.add_agent(world, OWNER, {"name": "bob", "provider": "openai", "model": "m", "base_url": url,
                                                  "system_prompt": f"Use the search API with key {key}."})
    snapshot, info = await engine.snapshot(world), await engine.get_world(world)
    for shown in (added, snapshot["agents"], info["agents"], [e for e in await harness.events()]):
        assert "Hunter2Pass" not in json.dumps(shown) and key not in json.dumps(shown)
    # The page's edit form sends back every field as it was shown: only what the owner changed changes.
    [bob] = info["agents"]
    await engine.update_agent(world, OWNER, "bob", {"base_url": bob["base_url"], "system_prompt": bob["system_prompt"],
                                                    "model": "m2"})
    real = await engine.agent(world, "bob")
    assert (real["base_url"], real["model"]) == (url, "m2") and key in real["system_prompt"]


async def test_an_agent_edit_around_a_hidden_value_is_refused_not_stored_as_redacted(harness: Harness) -> None:
    from server.errors import AppError
    from tests.fixtures.engine import OWNER

    await harness.make_world()
    engine, world = harness.engine, harness.world
    url = "https://proxyuser:Hunter2Pass@llm.example.com/v1"
    shown = await engine.add_agent(world, OWNER, {"name": "bob", "provider": "openai", "model": "m", "base_url": url})
    moved = shown["base_url"].replace("llm.example.com", "other.example.com")
    with pytest.raises(AppError) as refused:
        await engine.update_agent(world, OWNER, "bob", {"base_url": moved})
    assert refused.value.code == vocab.INVALID and "base_url" in refused.value.message
    assert (await engine.agent(world, "bob"))["base_url"] == url


async def test_past_the_worlds_llm_budget_an_agent_waits_says_so_and_can_be_stopped(harness: Harness) -> None:
    await harness.make_world("alice", llm_calls_per_minute=1)
    harness.double.respond_with(lambda body: Text("answered"))
    await harness.say("one")
    await harness.wait_for(lambda e: e.get("content") == "answered")
    await harness.say("two")  # the minute's one call is spent: this one waits a minute for the next
    [notice] = await harness.wait_for(lambda e: e["kind"] == vocab.NOTICE)
    assert "llm_calls_per_minute" in notice["text"] and "alice waits 60 s" in notice["text"]
    assert len(harness.double.requests) == 1  # nothing was sent while it waits
    assert await harness.engine.cancel_turn(harness.world, harness_owner(), "alice")
    [stopped] = await harness.wait_for(lambda e: e.get("stopped"))
    assert stopped["sender"] == "alice" and len(harness.double.requests) == 1
    await harness.idle()


async def test_a_reply_past_the_worlds_reply_limit_ends_the_turn_with_a_clear_error(harness: Harness) -> None:
    await harness.make_world("alice", llm_reply_limit=1000)
    harness.double.respond_with(lambda body: Text("z" * 4000, chunk_size=200))
    await harness.say("write me a novel")
    [error] = await harness.wait_for(lambda e: e["kind"] == vocab.AGENT_ERROR)
    assert "passed 1000 characters (llm_reply_limit)" in error["message"]
    assert len(harness.double.requests) == 1  # not retried: the same request would bring the same reply
    assert not [e for e in await harness.events() if e.get("role") == "assistant"]


async def test_a_large_message_leaves_redacted_by_a_worker_that_knows_the_servers_secrets(harness: Harness) -> None:
    """Over 64 KiB an event is redacted in a worker process (server/offload.py: in a thread it held the GIL
    the loop needs); the worker must hide what this process knows, and its form serves later readers."""
    from server.engine.store import channel
    from server.redact import remember_secret

    secret = "this-server-knows-it-" + "q7" * 8  # known, not random-looking: only the known list hides it
    remember_secret(secret)
    await harness.make_world()
    frames: list[str] = []
    async with harness.engine.store.bus.subscribe(channel(harness.world)) as sub:
        said = await harness.say(f"the key is {secret}\n" + "lorem ipsum " * 7000)
        while (frame := sub.get_nowait()) is not None:
            frames.append(frame)
    [published] = [json.loads(f)["event"] for f in frames if said["id"] in f]
    assert secret not in published["content"] and published["content"].startswith("the key is [redacted]\n")
    [read] = [e for e in await harness.events() if e.get("id") == said["id"]]
    assert read == published  # the same public form, not redacted a second time
