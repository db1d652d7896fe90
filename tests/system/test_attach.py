"""`agent-world attach`: the Textual client driven headless by Textual's pilot against a real server."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx2 as httpx
import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Static, TextArea

from agent_world_client.edit import EditScreen
from agent_world_client.tui import AttachApp, ConfirmScreen, QueueScreen
from server.cli import build_parser, main
from server.testing.openai_double import OpenAIDouble, Text, ToolCalls
from tests.fixtures.api import all_events, client_for, invite, make_world, wait_until
from tests.fixtures.server import ServerProcess

RESULTS = Path(__file__).resolve().parents[2] / "test-results"


def _write_call(call_id: str, path: str = "notes.md") -> ToolCalls:
    return ToolCalls([(call_id, "file_write", json.dumps({"path": path, "content": "hi"}))])


def _shell_call(call_id: str, command: str) -> ToolCalls:
    return ToolCalls([(call_id, "shell_exec", json.dumps({"command": command}))])


async def _until(probe: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> None:
    async with asyncio.timeout(timeout):
        while not probe():  # the app's own state, on the test's loop: nothing to await but a change
            await asyncio.sleep(0.05)
    assert probe(), what


def _conversation(app: AttachApp) -> str:
    return "\n".join(str(w.content) for w in app.query("#conversation Static").results(Static))


def _decisions(owner: httpx.Client, world: str) -> list[dict[str, object]]:
    return [e["decision"] for e in all_events(owner, world) if e.get("decision")]


def _selected(queue: QueueScreen) -> str | None:
    """Read afresh: a checker keeps an earlier `==` as a narrowing across awaits that change it."""
    return queue.selected


def _attach(server: ServerProcess, owner: httpx.Client, llm: OpenAIDouble,
            *replies: Text | ToolCalls) -> tuple[str, AttachApp]:
    """A new world whose agent alice will give `replies`, and the terminal client of it (not yet running)."""
    world = make_world(owner, llm)
    llm.queue(*replies)
    return world, AttachApp(server.url, world, server.token)


def test_attach_is_a_command() -> None:
    args = build_parser().parse_args(["attach", "demo", "--url", "http://127.0.0.1:1", "--token", "t"])
    assert (args.world, args.url, args.token) == ("demo", "http://127.0.0.1:1", "t")


def test_attach_without_a_token_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AGENT_WORLD_TOKEN", raising=False)
    assert main(["attach", "demo", "--url", "http://127.0.0.1:1"]) == 2
    assert "give --token or set AGENT_WORLD_TOKEN" in capsys.readouterr().err


async def test_replay_and_live_streaming_and_agent_states(server: ServerProcess, owner: httpx.Client,
                                                          llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(Text("an earlier answer"), Text("streamed live, word by word", chunk_size=3, delay=0.05))
    owner.post(f"/api/worlds/{world}/messages", json={"content": "before attaching"})
    wait_until(lambda: any(e.get("content") == "an earlier answer" for e in all_events(owner, world)))
    app = AttachApp(server.url, world, server.token)
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(lambda: "an earlier answer" in _conversation(app), what="the replay")
        assert "human:owner: before attaching" in _conversation(app)
        assert "alice: idle" in str(app.query_one("#agents", Static).content)
        await pilot.click("#composer")
        await pilot.press(*"hello again", "enter")
        await _until(lambda: "▌" in _conversation(app), what="a streamed chunk")  # text still arriving
        await _until(lambda: "alice: streamed live, word by word" in _conversation(app) and "▌" not in
                     _conversation(app), what="the stored message replacing the stream")
        assert app.query_one("#composer", Input).value == ""


async def test_approve_once_through_the_queue(server: ServerProcess, owner: httpx.Client,
                                              llm_double: OpenAIDouble) -> None:
    world, app = _attach(server, owner, llm_double, _write_call("call_q1"), Text("done"))
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(lambda: app.client.connected.is_set())
        await pilot.click("#composer")
        await pilot.press(*"write it", "enter")
        await _until(lambda: app.client.state.pending, what="the approval request")
        await pilot.pause()
        assert "1 pending" in str(app.query_one("#queue-bar", Static).content)
        assert not isinstance(app.screen, QueueScreen)  # a request never opens anything by itself
        await pilot.press("ctrl+a")
        assert isinstance(app.screen, QueueScreen)
        RESULTS.mkdir(exist_ok=True)
        app.save_screenshot(filename="attach-queue.svg", path=str(RESULTS))
        await pilot.press("o")
        await _until(lambda: "done" in _conversation(app), what="the tool ran and alice answered")
        assert _decisions(owner, world)[0]["scope"] == "once"
        await pilot.press("escape")
        app.save_screenshot(filename="attach.svg", path=str(RESULTS))
    assert (RESULTS / "attach.svg").read_text().startswith("<svg")


async def test_typing_while_a_request_arrives_decides_nothing(server: ServerProcess, owner: httpx.Client,
                                                              llm_double: OpenAIDouble) -> None:
    world, app = _attach(server, owner, llm_double, _write_call("call_t1"))
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(lambda: app.client.connected.is_set())
        owner.post(f"/api/worlds/{world}/messages", json={"content": "write notes"})
        await pilot.click("#composer")
        typed = "oooo ssss aaaa dddd yyy "
        for index, key in enumerate(typed):  # keys keep coming while the request arrives
            await pilot.press("space" if key == " " else key)
            if index == 4:
                await _until(lambda: app.client.state.pending, what="the approval request")
        await pilot.press("enter")  # even enter only sends the typed text as a message
        await pilot.pause(0.5)
        assert not isinstance(app.screen, QueueScreen | ConfirmScreen)
        assert len(app.client.state.pending) == 1
        assert _decisions(owner, world) == []
        assert app.sent == [{"say": typed.strip()}]
        await pilot.click("#queue-bar")  # the deliberate act that opens the queue (or ctrl+a)
        assert isinstance(app.screen, QueueScreen)


async def test_a_wide_scope_asks_to_confirm_what_it_allows(server: ServerProcess, owner: httpx.Client,
                                                           llm_double: OpenAIDouble) -> None:
    world, app = _attach(server, owner, llm_double, _write_call("call_c1"), Text("ok"))
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(lambda: app.client.connected.is_set())
        owner.post(f"/api/worlds/{world}/messages", json={"content": "write notes"})
        await _until(lambda: app.client.state.pending, what="the approval request")
        await pilot.press("ctrl+a", "a")
        assert isinstance(app.screen, ConfirmScreen)
        assert "Allow every agent to run file_write in this world from now on" in app.screen.text
        await pilot.press("n")  # no: back in the queue, nothing decided
        assert isinstance(app.screen, QueueScreen)
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        assert "Allow alice to run file_write in chat main from now on" in app.screen.text
        await pilot.press("enter")  # not a confirmation
        assert isinstance(app.screen, ConfirmScreen) and _decisions(owner, world) == []
        await pilot.press("y")
        await _until(lambda: not app.client.state.pending, what="the decision")
        assert [(d["decision"], d["scope"]) for d in _decisions(owner, world)] == [("approve", "session")]


async def test_nothing_is_sent_while_disconnected(server: ServerProcess, owner: httpx.Client,
                                                  llm_double: OpenAIDouble) -> None:
    world, app = _attach(server, owner, llm_double)
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(lambda: app.client.connected.is_set())
        before = len(all_events(owner, world))
        await asyncio.to_thread(server.stop)
        await _until(lambda: not app.client.connected.is_set(), what="the loss")
        await pilot.click("#composer")
        await pilot.press(*"lost words", "enter")
        assert app.query_one("#composer", Input).value == "lost words"  # kept, to send again later
        assert "disconnected" in str(app.query_one("#conn", Static).content)
        await asyncio.to_thread(server.start)
        await _until(lambda: app.client.connected.is_set(), what="the reconnection")
        with httpx.Client(base_url=server.url, headers=server.headers) as again:
            assert len(all_events(again, world)) == before
        await pilot.press("enter")
        await _until(lambda: app.sent == [{"say": "lost words"}], what="the message, sent once connected")


async def test_a_key_meant_for_a_request_decided_elsewhere_decides_nothing_else(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    calls = [(f"call_x{i}", "file_write", json.dumps({"path": f"n{i}.md", "content": "hi"})) for i in (1, 2)]
    world, app = _attach(server, owner, llm_double, ToolCalls(calls))
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(lambda: app.client.connected.is_set())
        owner.post(f"/api/worlds/{world}/messages", json={"content": "write both"})
        await _until(lambda: len(app.client.state.pending) == 2, what="two requests")
        await pilot.press("ctrl+a")
        queue = app.screen
        assert isinstance(queue, QueueScreen) and queue.selected == "approval_call_x1"
        decided = owner.post(f"/api/worlds/{world}/tool-results", json={
            "role": "tool", "tool_call_id": "approval_call_x1", "content": json.dumps({"decision": "deny"})})
        assert decided.status_code == 201, decided.text
        await _until(lambda: len(app.client.state.pending) == 1, what="the other person's decision")
        await pilot.press("o")  # meant for x1, which is gone: nothing is selected, x2 stays pending
        await pilot.pause(0.3)
        assert _selected(queue) is None and app.sent == []
        assert [d["decision"] for d in _decisions(owner, world)] == ["deny"]
        await pilot.press("down", "o")  # selecting x2 on purpose, then deciding it, works
        await _until(lambda: not app.client.state.pending, what="x2 approved")


async def test_the_queue_shows_who_approved_a_request_that_needs_two(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world, app = _attach(server, owner, llm_double, _write_call("call_two"))
    owner.post(f"/api/worlds/{world}/rules", json={"tool": "file_write", "effect": "ask", "approvals_required": 2})
    maria, carol = (invite(owner, world, "member", name)["token"] for name in ("maria", "carol"))
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(lambda: app.client.connected.is_set())
        with client_for(server, maria) as as_maria, client_for(server, carol) as as_carol:
            as_maria.post(f"/api/worlds/{world}/messages", json={"content": "write notes"})
            await _until(lambda: app.client.state.pending, what="the request")
            as_carol.post(f"/api/worlds/{world}/tool-results", json={
                "role": "tool", "tool_call_id": "approval_call_two",
                "content": json.dumps({"decision": "approve", "scope": "once"})})
        await _until(lambda: "approved file_write (once, 1 of 2)" in _conversation(app), what="carol's approval")
        await pilot.press("ctrl+a")
        assert "1 of 2 approvals: human:carol" in str(app.screen.query_one("#queue-list", Static).content)


async def _open_edit_form(app: AttachApp, pilot: Pilot[None], owner: httpx.Client, world: str) -> EditScreen:
    """Asks alice to run her command and opens the edit form of the request, on purpose (ctrl+a, e)."""
    await _until(lambda: app.client.connected.is_set())
    owner.post(f"/api/worlds/{world}/messages", json={"content": "run it"})
    await _until(lambda: app.client.state.pending, what="the approval request")
    await pilot.press("ctrl+a", "e")
    edit = app.screen
    assert isinstance(edit, EditScreen)
    area = edit.query_one("#edit-args", TextArea)
    assert json.loads(area.text) == {"command": "echo as-asked"} and area.has_focus
    return edit


def _status(edit: EditScreen) -> str:
    return str(edit.query_one("#edit-status", Static).content)


async def test_edit_and_approve_runs_the_edited_command(server: ServerProcess, owner: httpx.Client,
                                                        llm_double: OpenAIDouble) -> None:
    world, app = _attach(server, owner, llm_double, _shell_call("call_e1", "echo as-asked"), Text("done"))
    async with app.run_test(size=(120, 36)) as pilot:
        edit = await _open_edit_form(app, pilot, owner, world)
        assert _status(edit) == "nothing edited: approve it as it is from the queue (o)"
        # Editing with the keyboard: to the end of the command, "asked" out, "edited" in. The keys typed
        # in the text ("e", "d", enter would be too) only edit it.
        await pilot.press("down", "end", "left", *["backspace"] * 5, *"edited")
        assert json.loads(edit.query_one("#edit-args", TextArea).text) == {"command": "echo as-edited"}
        assert _status(edit) == "edited: command" and app.sent == []
        await pilot.press("escape", "enter")  # leave the text, then "Approve edited" (focused)
        await _until(lambda: not isinstance(app.screen, EditScreen), what="the form closed")
        assert isinstance(app.screen, QueueScreen)
        results: list[dict[str, object]] = []

        def ran() -> bool:
            results[:] = [e for e in all_events(owner, world) if e.get("role") == "tool" and not e.get("decision")]
            return bool(results)
        await _until(ran, what="the edited command ran")
        assert app.sent == [{"decision": "approve", "scope": "once", "approval": "approval_call_e1",
                             "arguments": {"command": "echo as-edited"}}]
        [result] = results
        assert json.loads(str(result["content"]))["output"] == "as-edited\n"
        assert result["edited"] == {"by": "human:owner", "changed": ["command"],
                                    "arguments": {"command": "echo as-edited"}}
        [decision] = _decisions(owner, world)
        assert decision["changed"] == ["command"] and decision["original"] == {"command": "echo as-asked"}
        await _until(lambda: "approved shell_exec (once, edited: command)" in _conversation(app),
                     what="the decision marked as edited")
        # The result is a frame of its own, after the decision's: stored (above) is not yet shown here.
        # The step says what ran, and what was asked: the edit is on screen, not only in the audit.
        await _until(lambda: "← shell_exec ran `echo as-edited` (edited by owner from `echo as-asked`): "
                     in _conversation(app), what="the result saying what ran")


async def test_invalid_json_in_the_edit_form_sends_nothing(server: ServerProcess, owner: httpx.Client,
                                                           llm_double: OpenAIDouble) -> None:
    world, app = _attach(server, owner, llm_double, _shell_call("call_e2", "echo as-asked"))
    async with app.run_test(size=(120, 36)) as pilot:
        edit = await _open_edit_form(app, pilot, owner, world)
        # The closing brace out, and keys that decide elsewhere typed in: here they are only text.
        await pilot.press("ctrl+end", "backspace", "enter", *"oyd")
        assert _status(edit).startswith("invalid JSON: ")
        await pilot.press("escape", "enter")  # "Approve edited": refused inline, back in the text
        await pilot.pause()
        assert app.screen is edit and edit.query_one("#edit-args", TextArea).has_focus
        assert _status(edit).startswith("invalid JSON: ")
        await pilot.press("escape", "escape")  # leave the text, then cancel: back in the queue
        assert isinstance(app.screen, QueueScreen)
        await pilot.pause(0.3)
        assert app.sent == [] and _decisions(owner, world) == [] and len(app.client.state.pending) == 1


async def test_a_chunk_that_comes_after_its_whole_message_changes_nothing(server: ServerProcess, owner: httpx.Client,
                                                                          llm_double: OpenAIDouble) -> None:
    # Through two processes a stream's last chunk may come after the stored message (the bus carries
    # them apart): the finished message must stay as stored, not turn back into a stream.
    world, app = _attach(server, owner, llm_double, Text("the whole answer"))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.click("#composer")
        await pilot.press(*"go", "enter")
        # The stored message, not its stream (which ends in a cursor), or the late chunk would find the stream.
        await _until(lambda: "alice: the whole answer" in _conversation(app) and "▌" not in _conversation(app),
                     what="the stored answer")
        answer = next(e for e in all_events(owner, world) if e.get("content") == "the whole answer")
        app.show_chunk({"type": "chunk", "agent": "alice", "chat": answer["chat"], "message_id": answer["id"],
                        "delta": "the whole", "at": 0})
        assert "alice: the whole answer" in _conversation(app) and "▌" not in _conversation(app)


async def test_a_reset_drops_the_messages_the_storage_lost(server: ServerProcess, owner: httpx.Client,
                                                           llm_double: OpenAIDouble) -> None:
    """The storage lost the events after a seq (docs/protocol.md §6 `reset`): the messages shown for them
    go, and the person is told; the ones before stay."""
    world = make_world(owner, llm_double, agents=())
    kept = owner.post(f"/api/worlds/{world}/messages", json={"content": "kept"}).json()["seq"]
    owner.post(f"/api/worlds/{world}/messages", json={"content": "lost"})
    app = AttachApp(server.url, world, server.token)
    async with app.run_test(size=(120, 36)):
        await _until(lambda: "lost" in _conversation(app), what="the replay")
        app.on_frame({"type": "reset", "after": kept,
                      "message": f"the storage lost this world's events after seq {kept}"})
        await _until(lambda: "lost" not in _conversation(app), what="the lost message dropped")
        assert "human:owner: kept" in _conversation(app)


async def test_a_denied_call_reads_denied_never_ran(server: ServerProcess, owner: httpx.Client,
                                                    llm_double: OpenAIDouble) -> None:
    """A call nobody let run says who or what refused it: a person's denial, a deny rule (issue #28, item 7)."""
    calls = [("call_d1", "shell_exec", json.dumps({"command": "rm -rf victim"})),
             ("call_d2", "file_write", json.dumps({"path": "notes.md", "content": "hi"}))]
    world, app = _attach(server, owner, llm_double, ToolCalls(calls), Text("ok"))
    owner.post(f"/api/worlds/{world}/rules", json={"tool": "file_write", "effect": "deny"}).raise_for_status()
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(lambda: app.client.connected.is_set())
        owner.post(f"/api/worlds/{world}/messages", json={"content": "clean up"})
        await _until(lambda: app.client.state.pending, what="the approval request")
        await pilot.press("ctrl+a", "d")
        await _until(lambda: "✗ shell_exec `rm -rf victim` not run: denied by owner" in _conversation(app),
                     what="the person's denial on the call's step")
        assert "✗ file_write `notes.md` not run: denied by rule" in _conversation(app)
        assert " ran" not in _conversation(app)
