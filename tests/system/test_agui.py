"""AG-UI (`POST /api/worlds/{world}/agui`) with the real `@ag-ui/client` from npm, driven by a small Node
script (tests/system/agui_client.cjs), against a real server: the chat's history as a MESSAGES_SNAPSHOT (redacted,
without `client.*` traffic), streamed text, an approval as a frontend tool call answered by the client, and
the same role checks as every decision."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from server.testing.openai_double import OpenAIDouble, Text, ToolCalls
from tests.fixtures.api import all_events, invite, make_world, wait_until
from tests.fixtures.engine import Harness
from tests.fixtures.npm import NPM_CACHE, npm_install
from tests.fixtures.server import ServerProcess

AG_UI_CLIENT = "@ag-ui/client@1.0.0"
SCRIPT = Path(__file__).with_name("agui_client.cjs")


@pytest.fixture(scope="session")
def agui_node_modules() -> Path:
    """@ag-ui/client installed once into the npm cache folder (a failed install fails the tests)."""
    modules = NPM_CACHE / "node_modules"
    npm_install(AG_UI_CLIENT, modules / "@ag-ui" / "client" / "package.json")
    return modules


def _drive(modules: Path, server: ServerProcess, world: str, token: str, say: str,
           decision: dict[str, Any] | None = None, thread: str = "main") -> dict[str, Any]:
    config = {"url": server.url, "token": token, "world": world, "threadId": thread, "say": say, "decision": decision}
    done = subprocess.run(["node", str(SCRIPT), json.dumps(config)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NODE_PATH": str(modules)}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[:1500] + "\n--- server log:\n" + server.log()[-4000:]
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen


def _write_call(call_id: str, content: str = "hi") -> ToolCalls:
    return ToolCalls([(call_id, "file_write", json.dumps({"path": "notes.md", "content": content}))])


def _history(owner: httpx.Client, world: str, say: str, call_id: str) -> None:
    """A finished turn in the chat before the AG-UI client comes: `say`, alice's call `call_id` (approved
    over HTTP: an approval request and a decision in the log) and its result, then alice's reply."""
    owner.post(f"/api/worlds/{world}/messages", json={"content": say})
    wait_until(lambda: owner.get(f"/api/worlds/{world}/approvals/pending").json(), what="the request")
    approved = owner.post(f"/api/worlds/{world}/tool-results", json={
        "role": "tool", "tool_call_id": f"approval_{call_id}", "content": json.dumps({"decision": "approve"})})
    assert approved.status_code == 201, approved.text
    wait_until(lambda: any(e.get("role") == "assistant" and e.get("content") for e in all_events(owner, world)),
               what="alice's reply")


def test_a_run_streams_text_from_start_to_finish(agui_node_modules: Path, server: ServerProcess,
                                                 owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(Text("hello from alice", chunk_size=3))
    (run,) = _drive(agui_node_modules, server, world, server.token, "hi alice")["runs"]
    assert "error" not in run, run
    types = run["events"]
    assert types[:3] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT"] and types[-1] == "RUN_FINISHED"
    assert types.index("TEXT_MESSAGE_START") < types.index("TEXT_MESSAGE_CONTENT") < types.index("TEXT_MESSAGE_END")
    assert list(run["text"].values()) == ["hello from alice"]
    # The first state is the world's once the input is stored: alice may have begun on it by then.
    assert run["states"][0]["agents"] in ({"alice": "idle"}, {"alice": "thinking"})
    assert run["states"][-1]["agents"] == {"alice": "idle"}
    assert {"role": "assistant", "content": "hello from alice"}.items() <= run["newMessages"][-1].items()
    said = [e for e in all_events(owner, world) if e.get("role") == "user"]
    assert [(e["content"], e["sender"]) for e in said] == [("hi alice", "human:owner")]


def test_an_approval_is_a_frontend_tool_call_the_client_answers(agui_node_modules: Path, server: ServerProcess,
                                                                owner: httpx.Client,
                                                                llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(_write_call("call_ag1"), Text("notes written"))
    first, second = _drive(agui_node_modules, server, world, server.token, "write notes",
                           decision={"decision": "approve", "scope": "once"})["runs"]
    assert "error" not in first and "error" not in second, (first, second)
    by_name = {c["name"]: c for c in first["toolCalls"]}
    assert set(by_name) == {"file_write", "requestApproval"}
    request = by_name["requestApproval"]["args"]  # the client parses the streamed arguments
    assert by_name["requestApproval"]["id"] == "approval_call_ag1" == request["approvalId"]
    assert (request["toolName"], request["toolArguments"], request["agent"]) == (
        "file_write", {"path": "notes.md", "content": "hi"}, "alice")
    assert first["events"][-1] == "RUN_FINISHED" and first["states"][-1]["agents"] == {"alice": "waiting_approval"}
    # The second run carried the answer: the tool ran, its result and alice's reply stream back.
    assert second["results"] == ["call_ag1"] and second["events"][-1] == "RUN_FINISHED"  # not the answered one
    assert "notes written" in second["text"].values()
    decisions = [e for e in all_events(owner, world) if e.get("decision")]
    assert [(d["sender"], d["decision"]["decision"], d["decision"]["scope"]) for d in decisions] == [
        ("human:owner", "approve", "once")]


def test_an_approval_with_hidden_characters_reaches_ag_ui_with_its_warning(
        agui_node_modules: Path, server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    disguised = "echo ok; X=\u202e # \u202dmitciv fr- mr\u200b"  # reads as `echo ok; X= # rm -rf victim`
    llm_double.queue(ToolCalls([("call_hid", "shell_exec", json.dumps({"command": disguised}))]), Text("denied"))
    first, _ = _drive(agui_node_modules, server, world, server.token, "run it", decision={"decision": "deny"})["runs"]
    request = next(c["args"] for c in first["toolCalls"] if c["name"] == "requestApproval")
    assert request["toolArguments"] == {"command": disguised}  # the real arguments, as they will run
    assert request["hiddenCharacters"] == ["U+202E RIGHT-TO-LEFT OVERRIDE", "U+202D LEFT-TO-RIGHT OVERRIDE",
                                           "U+200B ZERO WIDTH SPACE"]
    assert request["warning"].startswith("This call contains hidden or look-alike Unicode characters")
    # The state's pending list says it too, for a frontend that shows the queue from it.
    [pending] = first["states"][-1]["pendingApprovals"]
    assert pending["hiddenCharacters"] == request["hiddenCharacters"] and pending["warning"] == request["warning"]


def test_a_spectator_cannot_decide_through_ag_ui(agui_node_modules: Path, server: ServerProcess,
                                                 owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(_write_call("call_ag2"))
    owner.post(f"/api/worlds/{world}/messages", json={"content": "write notes"})
    spectator = invite(owner, world, "spectator", "sam")["token"]
    (run,) = _drive(agui_node_modules, server, world, spectator, "let me in")["runs"]
    assert "403" in run["error"] or "forbidden" in run["error"], run
    answer = {"threadId": "main", "runId": "r", "state": None, "tools": [], "context": [], "forwardedProps": None,
              "messages": [{"id": "t", "role": "tool", "toolCallId": "approval_call_ag2",
                            "content": json.dumps({"decision": "approve", "scope": "once"})}]}
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {spectator}"}) as sam:
        refused = sam.post(f"/api/worlds/{world}/agui", json=answer)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert not [e for e in all_events(owner, world) if e.get("decision")]


def test_ag_ui_needs_credentials_and_a_run_agent_input(server: ServerProcess, owner: httpx.Client,
                                                       llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    assert httpx.post(f"{server.url}/api/worlds/{world}/agui", json={}).status_code == 401
    bad = owner.post(f"/api/worlds/{world}/agui", json={"threadId": "main"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"


def test_an_answer_for_another_worlds_approval_is_unknown_here(server: ServerProcess, owner: httpx.Client,
                                                               llm_double: OpenAIDouble) -> None:
    """The answer goes through the engine's one path: an approval id of world A is not pending in world B."""
    first = make_world(owner, llm_double, name="A")
    second = make_world(owner, llm_double, name="B", agents=())
    llm_double.queue(_write_call("call_ag3"))
    owner.post(f"/api/worlds/{first}/messages", json={"content": "write notes"})
    wait_until(lambda: owner.get(f"/api/worlds/{first}/approvals/pending").json(), what="the request in A")
    member = invite(owner, second, "member", "maria")["token"]
    answer = {"threadId": "main", "runId": "r", "messages": [
        {"id": "t", "role": "tool", "toolCallId": "approval_call_ag3",
         "content": json.dumps({"decision": "approve", "scope": "once"})}]}
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {member}"}) as maria:
        refused = maria.post(f"/api/worlds/{second}/agui", json=answer)
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "unknown_tool_call"
    assert len(owner.get(f"/api/worlds/{first}/approvals/pending").json()) == 1


def test_a_run_starts_with_the_chat_history_as_a_messages_snapshot(agui_node_modules: Path, server: ServerProcess,
                                                                   owner: httpx.Client,
                                                                   llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(_write_call("call_h1"), Text("notes written"), Text("nothing more"))
    _history(owner, world, "write notes", "call_h1")
    result = _drive(agui_node_modules, server, world, server.token, "and now?")
    (run,) = result["runs"]
    assert "error" not in run and run["events"][:3] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT"], run
    (snapshot,) = run["snapshots"]
    # People's and agents' messages with the tool call and its result; the approval request and the
    # decision (client.requestApproval traffic) are not in it. The run's own message is, as stored.
    assert [(m["role"], m.get("name"), m.get("content")) for m in snapshot] == [
        ("user", "owner", "write notes"), ("assistant", "alice", None), ("tool", None, snapshot[2]["content"]),
        ("assistant", "alice", "notes written"), ("user", "owner", "and now?")]
    (call,) = snapshot[1]["toolCalls"]
    assert (call["id"], call["type"], call["function"]["name"]) == ("call_h1", "function", "file_write")
    assert json.loads(call["function"]["arguments"]) == {"path": "notes.md", "content": "hi"}
    assert snapshot[2]["toolCallId"] == "call_h1"
    stored = {e["id"] for e in all_events(owner, world) if e.get("kind") == "message"}
    assert {m["id"] for m in snapshot} <= stored
    # The client applied it: its own copy of the message ("user-1") gave way to the stored one, and the
    # reply streamed after the snapshot follows it, once.
    assert [m["id"] for m in run["messages"]][:5] == [m["id"] for m in snapshot]
    assert [(m["role"], m.get("content")) for m in run["messages"][5:]] == [("assistant", "nothing more")]
    assert "user-1" not in {m["id"] for m in result["messages"]}


def test_the_messages_snapshot_hides_secrets_as_every_event_does(agui_node_modules: Path, server: ServerProcess,
                                                                 owner: httpx.Client,
                                                                 llm_double: OpenAIDouble) -> None:
    secret = "sk-proj-" + "q7Zx3Lm9" * 4
    world = make_world(owner, llm_double)
    llm_double.queue(_write_call("call_s1", content=f"key={secret}"), Text(f"stored {secret} in notes.md"),
                     Text("ok"))
    _history(owner, world, f"keep my key {secret} in notes.md", "call_s1")
    result = _drive(agui_node_modules, server, world, server.token, "thanks")
    (run,) = result["runs"]
    assert "error" not in run, run
    (snapshot,) = run["snapshots"]
    assert secret not in json.dumps(result)
    user, assistant, _, reply, _ = snapshot
    assert user["content"] == "keep my key [redacted] in notes.md"
    assert "[redacted]" in assistant["toolCalls"][0]["function"]["arguments"]
    assert reply["content"] == "stored [redacted] in notes.md"


def test_an_mcp_servers_question_is_server_traffic_a_run_never_streams(agui_node_modules: Path, server: ServerProcess,
                                                                       owner: httpx.Client,
                                                                       llm_double: OpenAIDouble) -> None:
    # The history snapshot leaves `client.*` calls out; the live stream must too (a question is answered
    # on the page or the JSON socket, and its call is never a tool the AG-UI client should run).
    world = make_world(owner, llm_double)
    trouble = str(Path(__file__).parents[1] / "fixtures" / "mcp_trouble_server.py")
    servers = [{"name": "t", "command": sys.executable, "args": [trouble], "tools": {"book": {"approval": "never"}}}]
    assert owner.patch(f"/api/worlds/{world}", json={"settings": {"mcp_servers": servers}}).status_code == 200
    wait_until(lambda: "t__book" in {t["name"] for t in owner.get(f"/api/worlds/{world}").json()["tools"]},
               what="the MCP server's tools", timeout=30)
    llm_double.queue(ToolCalls([("call_ask1", "t__book", "{}")]), Text("booked"))
    with ThreadPoolExecutor(1) as pool:
        driven = pool.submit(_drive, agui_node_modules, server, world, server.token, "book a table")
        [question] = wait_until(lambda: [e for e in all_events(owner, world) if e.get("elicitation")],
                                what="the server's question", timeout=60)
        answer = {"action": "accept", "content": {"guests": 2, "email": "a@example.com"}}
        answered = owner.post(f"/api/worlds/{world}/tool-results", json={
            "role": "tool", "tool_call_id": question["tool_calls"][0]["id"], "content": json.dumps(answer)})
        assert answered.status_code == 201, answered.text
        (run,) = driven.result(timeout=120)["runs"]
    assert "error" not in run, run
    assert [c["name"] for c in run["toolCalls"]] == ["t__book"], run["toolCalls"]
    assert run["results"] == ["call_ask1"] and "booked" in run["text"].values(), run


async def test_a_message_event_that_comes_twice_or_before_its_chunks_is_streamed_once() -> None:
    # When the bus could not publish an event, the store hands it to this process's readers (Bus.deliver_here),
    # and Redis may carry it too: a run sends the message once. Delivered here ahead of its chunks (still on
    # their way through Redis), the chunks that follow do not start the message again.
    from types import SimpleNamespace

    from server.api.agui.endpoint import _Run

    run = _Run(SimpleNamespace(world="w"), SimpleNamespace(messages=[]), "main", None, [], acted=True)  # type: ignore[arg-type]
    message = {"type": "event", "event": {"seq": 7, "kind": "message", "id": "msg_1", "chat": "main",
                                          "agent": "alice", "role": "assistant", "content": "hello"}}
    chunk = {"type": "chunk", "chat": "main", "agent": "alice", "message_id": "msg_1", "delta": "hel", "at": 0}
    sent = [event.type for frame in (message, message, chunk) for event in await run._translate(frame)]
    assert sent == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"], sent
    assert not run.streaming


async def test_a_message_stored_while_its_chunks_are_still_on_their_way_is_sent_whole() -> None:
    # Through two processes the stored message can come after some of its chunks and before the rest:
    # the run sends what is missing before it ends the message, and the late chunks change nothing.
    from types import SimpleNamespace

    from server.api.agui.endpoint import _Run

    run = _Run(SimpleNamespace(world="w"), SimpleNamespace(messages=[]), "main", None, [], acted=True)  # type: ignore[arg-type]
    first = {"type": "chunk", "chat": "main", "agent": "alice", "message_id": "msg_1", "delta": "hel", "at": 0}
    late = {"type": "chunk", "chat": "main", "agent": "alice", "message_id": "msg_1", "delta": "lo", "at": 3}
    message = {"type": "event", "event": {"seq": 7, "kind": "message", "id": "msg_1", "chat": "main",
                                          "agent": "alice", "role": "assistant", "content": "hello"}}
    # AG-UI events of several classes, read by their `type` as a client does
    sent: list[Any] = [event for frame in (first, message, late) for event in await run._translate(frame)]
    assert [event.type for event in sent] == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT",
                                              "TEXT_MESSAGE_END"], sent
    assert "".join(event.delta for event in sent if event.type == "TEXT_MESSAGE_CONTENT") == "hello"


async def test_a_retried_reply_whose_streamed_text_went_wrong_is_replaced_by_the_stored_messages(
        harness: Harness) -> None:
    # A retry streams its reply again from the start (after a `reset` chunk), and AG-UI deltas cannot take
    # back what the first attempt sent: the client was left with both attempts' text ("helhello").
    from types import SimpleNamespace

    from server.api.agui.endpoint import _Run

    await harness.make_world("alice")
    harness.double.respond_with(lambda body: Text("hello world"))
    await harness.say("hi")
    [stored] = await harness.wait_for(lambda e: e.get("role") == "assistant" and e.get("content") == "hello world")
    call = SimpleNamespace(world=harness.world, ctx=SimpleNamespace(engine=harness.engine))
    run = _Run(call, SimpleNamespace(messages=[]), stored["chat"], None, [], acted=True)  # type: ignore[arg-type]
    chunk = {"type": "chunk", "chat": stored["chat"], "agent": "alice", "message_id": stored["id"]}
    frames = [{**chunk, "delta": "hel", "at": 0}, {**chunk, "delta": "", "reset": True},
              {**chunk, "delta": "hello", "at": 0}, {"type": "event", "event": stored}]
    sent: list[Any] = [event for frame in frames for event in await run._translate(frame)]
    assert [event.type for event in sent][-2:] == ["TEXT_MESSAGE_END", "MESSAGES_SNAPSHOT"], sent
    [replaced] = [m for m in sent[-1].messages if m.id == stored["id"]]
    assert replaced.content == "hello world"



async def test_a_run_that_is_told_of_a_missed_event_catches_up_instead_of_failing(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # A publish that failed after its event was stored is told to every subscriber as a Gap(down=False)
    # (Bus.missed), with no Gap(down=True) before it: the storage works. The run must catch up from the
    # log and go on, not end every AG-UI run of the world with "storage_unavailable: run again".
    import asyncio
    from types import SimpleNamespace

    from server.api.agui import endpoint as agui
    from server.bus.base import Gap

    monkeypatch.setattr(agui, "START_WAIT", 0.3)
    await harness.make_world("alice")
    harness.double.respond_with(lambda body: Text("hello world"))
    await harness.say("hi")
    [stored] = await harness.wait_for(lambda e: e.get("role") == "assistant" and e.get("content") == "hello world")

    class MissedOne:  # the run's subscription: the notice that the reply's publish failed, then nothing
        told = False

        async def get(self) -> str:
            if not self.told:
                self.told = True
                raise Gap("world", down=False)
            await asyncio.Event().wait()
            return ""
    call = SimpleNamespace(world=harness.world, ctx=SimpleNamespace(engine=harness.engine))
    run = agui._Run(call, SimpleNamespace(thread_id="t", run_id="r", messages=[]), stored["chat"],  # type: ignore[arg-type]
                    MissedOne(), [], acted=True)  # type: ignore[arg-type]
    async with asyncio.timeout(10):
        sent: list[Any] = [event async for event in run.events()]
    assert not [e for e in sent if e.type == "RUN_ERROR"], sent
    assert any(e.type == "MESSAGES_SNAPSHOT" and any(m.id == stored["id"] for m in e.messages) for e in sent), sent
    assert sent[-1].type == "RUN_FINISHED", sent


def _client_view(sent: list[Any]) -> tuple[set[str], dict[str, str]]:
    """What an AG-UI client holds after `sent`: the tool calls and the text of each message (a
    MESSAGES_SNAPSHOT replaces everything before it; a delta for a message it does not hold is dropped)."""
    calls: set[str] = set()
    texts: dict[str, str] = {}
    for event in sent:
        if event.type == "MESSAGES_SNAPSHOT":
            calls = {c.id for m in event.messages if m.role == "assistant" for c in m.tool_calls or []}
            texts = {m.id: m.content or "" for m in event.messages if m.role == "assistant"}
        elif event.type == "TOOL_CALL_START":
            calls.add(event.tool_call_id)
        elif event.type == "TEXT_MESSAGE_START":
            texts.setdefault(event.message_id, "")
        elif event.type == "TEXT_MESSAGE_CONTENT" and event.message_id in texts:
            texts[event.message_id] += event.delta
    return calls, texts


async def test_a_pending_approval_is_still_the_clients_to_answer_after_a_catch_up(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # The catch-up's MESSAGES_SNAPSHOT replaces the client's messages, and the history leaves approval
    # requests out (the run announces them as requestApproval calls of its own): a request announced
    # before it, or stored while its publish was missed, must be announced after it, or the client has
    # nothing to answer while the agent waits for it.
    import asyncio
    from types import SimpleNamespace

    from server.api.agui import endpoint as agui
    from server.bus.base import Gap

    monkeypatch.setattr(agui, "START_WAIT", 0.3)
    await harness.make_world("alice")
    harness.double.respond_with(lambda body: _write_call("call_w1"))
    await harness.say("write")
    [pending] = await harness.wait_pending(1)

    class MissedOne:
        told = False

        async def get(self) -> str:
            if not self.told:
                self.told = True
                raise Gap("world", down=False)
            await asyncio.Event().wait()
            return ""
    call = SimpleNamespace(world=harness.world, ctx=SimpleNamespace(engine=harness.engine))
    run = agui._Run(call, SimpleNamespace(thread_id="t", run_id="r", messages=[]), pending["chat"],  # type: ignore[arg-type]
                    MissedOne(), [], acted=True)  # type: ignore[arg-type]
    async with asyncio.timeout(10):
        sent: list[Any] = [event async for event in run.events()]
    assert [e.type for e in sent].count("MESSAGES_SNAPSHOT") == 2, sent
    calls, _ = _client_view(sent)
    assert agui._request_event(pending)["tool_calls"][0]["id"] in calls, sent


async def test_a_message_streaming_across_a_catch_up_reaches_the_client_whole(harness: Harness) -> None:
    # The catch-up's MESSAGES_SNAPSHOT replaces the client's messages: a reply still streaming (not stored
    # yet, so not in it) must be started again with its text so far, or the client drops the rest of it.
    from types import SimpleNamespace

    from server.api.agui.endpoint import _Run

    await harness.make_world("alice")
    call = SimpleNamespace(world=harness.world, ctx=SimpleNamespace(engine=harness.engine))
    chat = await harness.engine.latest_chat(harness.world)
    run = _Run(call, SimpleNamespace(messages=[]), chat, None, [], acted=True)  # type: ignore[arg-type]
    chunk = {"type": "chunk", "chat": chat, "agent": "alice", "message_id": "msg_s1"}
    sent: list[Any] = [*await run._translate({**chunk, "delta": "hel", "at": 0}), *await run._caught_up(),
            *await run._translate({**chunk, "delta": "lo", "at": 3})]
    stored = {"seq": 99, "kind": "message", "id": "msg_s1", "chat": chat, "agent": "alice", "role": "assistant",
              "content": "hello"}
    sent += await run._translate({"type": "event", "event": stored})
    _, texts = _client_view(sent)
    assert texts.get("msg_s1") == "hello", sent
    started = [e.type for e in sent
               if getattr(e, "message_id", None) == "msg_s1" and e.type.startswith("TEXT_MESSAGE_")]
    assert started.count("TEXT_MESSAGE_START") == started.count("TEXT_MESSAGE_END"), sent


async def test_an_agent_busy_in_another_chat_at_a_catch_up_does_not_hold_the_run(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # Live, a status of another chat is not this run's (the run ends once nothing starts in its chat, or
    # once its agents are done): a catch-up that finds an agent busy elsewhere must not count it as the
    # run's work, which would hold the run until that agent is idle (or end it then, before its reply here).
    import asyncio
    from types import SimpleNamespace

    from server import vocab
    from server.api.agui import endpoint as agui
    from server.bus.base import Gap

    monkeypatch.setattr(agui, "START_WAIT", 0.3)
    # RUN_LIMIT stays 600 s: a run held by the busy agent would end only then, and the wait below fails first.
    await harness.make_world("alice")
    chat = await harness.engine.latest_chat(harness.world)
    await harness.engine.status.set(harness.world, "alice", vocab.THINKING, chat="chat_elsewhere")

    class MissedOne:
        told = False

        async def get(self) -> str:
            if not self.told:
                self.told = True
                raise Gap("world", down=False)
            await asyncio.Event().wait()
            return ""
    call = SimpleNamespace(world=harness.world, ctx=SimpleNamespace(engine=harness.engine))
    run = agui._Run(call, SimpleNamespace(thread_id="t", run_id="r", messages=[]), chat,  # type: ignore[arg-type]
                    MissedOne(), [], acted=True)  # type: ignore[arg-type]
    async def run_to_its_end() -> list[Any]:
        return [event async for event in run.events()]

    try:
        sent = await asyncio.wait_for(run_to_its_end(), 60)
    except TimeoutError:
        raise AssertionError("the run waited for an agent busy in another chat") from None
    assert sent[-1].type == "RUN_FINISHED", sent
