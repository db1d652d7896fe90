"""Renaming and deleting chats: a rename keeps the chat's place (chats are listed by creation), cannot
bring a deleted chat back, and a deleted chat's open turns end."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.errors import AppError
from server.log.failures import StorageError
from server.testing.openai_double import OpenAIDouble
from tests.fixtures.engine import OWNER, Harness, log_refuses, log_refuses_once, open_engine, run_on_request, tool_calls
from tests.fixtures.eventually import eventually_async


async def test_a_renamed_chat_keeps_its_place(harness: Harness) -> None:
    await harness.make_world("alice")
    first = (await harness.engine.worlds.chats(harness.world))[0]["id"]
    newest = (await harness.engine.worlds.create_chat(harness.world, OWNER, "second"))["id"]
    await harness.engine.chats.rename(harness.world, OWNER, first, "renamed")
    chats = await harness.engine.worlds.chats(harness.world)
    assert [(c["id"], c["title"]) for c in chats][-1] == (newest, "second")
    assert next(c["title"] for c in chats if c["id"] == first) == "renamed"
    assert await harness.engine.worlds.latest_chat(harness.world) == newest


async def test_a_rename_racing_a_delete_does_not_bring_the_chat_back(harness: Harness) -> None:
    await harness.make_world("alice")
    doomed = (await harness.engine.worlds.create_chat(harness.world, OWNER, "doomed"))["id"]
    store = harness.engine.store
    append = store.append

    async def deleted_meanwhile(world: str, event: Any, ops: Any = ()) -> Any:
        if event.get("kind") == vocab.CHAT_RENAMED:  # the rename read the chat; the delete lands before it writes
            store.append = append  # type: ignore[method-assign]
            await harness.engine.chats.delete(world, OWNER, doomed)
        return await append(world, event, ops)

    store.append = deleted_meanwhile  # type: ignore[method-assign]
    try:
        with pytest.raises(AppError) as refused:
            await harness.engine.chats.rename(harness.world, OWNER, doomed, "back again")
    finally:
        store.append = append  # type: ignore[method-assign]
    assert refused.value.code == vocab.NOT_FOUND
    assert doomed not in [c["id"] for c in await harness.engine.worlds.chats(harness.world)]


async def _a_chat_with_a_pending_approval(harness: Harness) -> tuple[str, dict[str, Any]]:
    """A second chat, where alice's call waits for an approval; the chat's id and the pending request."""
    await harness.make_world("alice")
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "rm *"}, "ask")
    doomed = (await harness.engine.worlds.create_chat(harness.world, OWNER, "doomed"))["id"]
    harness.double.respond_with(run_on_request)
    await harness.say("run rm -f x", chat=doomed)
    [pending] = await harness.wait_pending(1)
    return doomed, pending


async def test_deleting_a_chat_denies_its_pending_approvals_and_ends_its_turns(harness: Harness) -> None:
    doomed, pending = await _a_chat_with_a_pending_approval(harness)
    await harness.engine.chats.delete(harness.world, OWNER, doomed)
    assert await harness.engine.pending_approvals(harness.world) == []
    [denial] = [e for e in await harness.events() if e.get("tool_call_id") == pending["id"]]
    assert denial["decision"]["decision"] == vocab.DENY and "chat deleted" in denial["content"]
    await harness.idle()  # no turn is owed in the deleted chat
    assert len(harness.double.requests) == 1  # the denial did not wake alice there


async def test_a_reply_in_flight_when_its_chat_is_deleted_is_dropped(harness: Harness) -> None:
    await harness.make_world("alice")
    doomed = (await harness.engine.worlds.create_chat(harness.world, OWNER, "doomed"))["id"]
    gate = threading.Event()  # the LLM answers only once the chat is gone
    harness.double.respond_with(lambda body: tool_calls(("shell_exec", {"command": "echo hi"}), text="too late")
                                if gate.wait(10) else None)
    await harness.say("@alice hello", chat=doomed)
    await harness.double.wait_for_requests_async(1)
    await eventually_async(lambda: harness.engine.status.get(harness.world, "alice").get("state"),
                           accept=lambda state: state != vocab.IDLE, what="alice thinking")
    await harness.engine.chats.delete(harness.world, OWNER, doomed)
    gate.set()
    await eventually_async(lambda: harness.engine.status.get(harness.world, "alice").get("state"),
                           accept=lambda state: state == vocab.IDLE, what="alice idle")
    assert [e for e in await harness.events() if e.get("kind") == vocab.MESSAGE and e.get("agent") == "alice"] == []
    assert await harness.engine.pending_approvals(harness.world) == []


async def test_a_deleted_chats_denial_the_log_refused_once_still_closes_its_requests(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chat was deleted, then the denial of its pending request could not be written (a full disk,
    Redis gone a moment): the request stayed pending for good, and deleting again only said NOT_FOUND."""
    doomed, pending = await _a_chat_with_a_pending_approval(harness)
    refused = log_refuses_once(harness, monkeypatch, lambda e: bool(e.get("decision")))
    try:
        await harness.engine.chats.delete(harness.world, OWNER, doomed)
    except StorageError:
        pass  # the client may be told; the chat is deleted all the same
    assert refused and doomed not in [c["id"] for c in await harness.engine.worlds.chats(harness.world)]
    await eventually_async(lambda: harness.engine.pending_approvals(harness.world), timeout=10,
                           what="no pending approval", accept=lambda left: left == [])
    [denial] = [e for e in await harness.events() if e.get("tool_call_id") == pending["id"]]
    assert denial["decision"]["decision"] == vocab.DENY and "chat deleted" in denial["content"]


async def test_a_deleted_chats_requests_are_denied_after_a_restart_that_cut_their_denial_short(
        tmp_path: Path, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """The denial of a deleted chat's requests is retried in the process that deleted it: one that
    stopped before the log took it left them pending for good."""
    engine, close = await open_engine(tmp_path)
    try:
        harness = Harness(engine, llm_double)
        doomed, pending = await _a_chat_with_a_pending_approval(harness)
        log_refuses(engine, monkeypatch, lambda e: bool(e.get("decision")))
        await engine.chats.delete(harness.world, OWNER, doomed)
    finally:
        await close()  # stopped while the log still refused the denial
    engine, close = await open_engine(tmp_path)
    try:
        await eventually_async(lambda: engine.pending_approvals(harness.world), timeout=10,
                               what="no pending approval", accept=lambda left: left == [])
        [denial] = [e for e in await engine.events(harness.world, 0, 1000) if e.get("tool_call_id") == pending["id"]]
        assert denial["decision"]["decision"] == vocab.DENY and "chat deleted" in denial["content"]
    finally:
        await close()
