"""`agent-world attach` shows untrusted text inert, and a request whole before `o` approves it (issue #28, item 8).

Driven headless by Textual's pilot against a real server and the OpenAI double, as tests/system/test_attach.py.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import cast

import httpx2 as httpx
from textual._compositor import CompositorUpdate
from textual.pilot import Pilot
from textual.widgets import Static

from agent_world_client.tui import AttachApp, QueueScreen
from server.testing.openai_double import OpenAIDouble, Text, ToolCalls
from tests.fixtures.api import make_world
from tests.fixtures.server import ServerProcess
from tests.system.test_attach import _conversation, _decisions, _until

# OSC 52 writes the clipboard, OSC 0 the window title, CSI clears the screen, asks the terminal to type
# its cursor position into stdin, and (8-bit, C1) moves the cursor; then a bidi override.
EVIL = "\x1b]52;c;cGF5bG9hZA==\x07\x1b]0;pwned\x1b\\\x1b[2J\x1b[6n\x9b5A\u202eevil"
RAW = ("\x1b]", "\x1b[2J", "\x1b[6n", "\x9b", "\u202e", "\x07")


def _terminal(app: AttachApp) -> str:
    """What the app writes to the terminal for its current screen (a real driver writes exactly this;
    the headless one writes nothing, so it is rendered here as the driver would)."""
    # textual declares a renderable; a full update is a CompositorUpdate (a LayoutUpdate)
    update = cast(CompositorUpdate, app.screen._compositor.render_update(full=True))
    return update.render_segments(app.console)


def _queue_text(app: AttachApp) -> str:
    return "\n".join(str(w.content) for w in app.screen.query(Static))


async def test_escape_sequences_in_text_output_and_arguments_never_reach_the_terminal(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    owner.post(f"/api/worlds/{world}/rules", json={"tool": "file_write", "effect": "allow"}).raise_for_status()
    # Raw C1 and bidi characters in the LLM's JSON text (JSON escapes only C0 ones).
    arguments = '{"command": "echo \x9b2J\u202e \\u001b]0;title\\u0007"}'
    llm_double.queue(ToolCalls([("call_w", "file_write", json.dumps({"path": "evil.txt", "content": EVIL}))]),
                     ToolCalls([("call_r", "file_read", json.dumps({"path": "evil.txt"}))]),
                     ToolCalls([("call_s", "shell_exec", arguments)], text=f"look {EVIL}"))
    app = AttachApp(server.url, world, server.token)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(lambda: app.client.connected.is_set())
        owner.post(f"/api/worlds/{world}/messages", json={"content": "show me"})
        await _until(lambda: app.client.state.pending and "look" in _conversation(app), what="text, output, request")
        # A stream's chunks too, before their message is stored.
        app.show_chunk({"type": "chunk", "agent": f"bob{EVIL}", "chat": "main", "message_id": "msg_live",
                        "delta": EVIL, "at": 0})
        await pilot.pause()
        shown = _conversation(app)
        assert "← file_read" in shown and "alice: look" in shown
        assert not [raw for raw in RAW if raw in shown], shown
        assert "\\x1b]52;c;cGF5bG9hZA==\\x07" in shown  # shown escaped: the reader sees it was there
        assert not [raw for raw in RAW if raw in _terminal(app)]
        await pilot.press("ctrl+a")
        assert isinstance(app.screen, QueueScreen)
        await pilot.pause()
        queue = _queue_text(app)
        assert "\\u009b2J\\u202e" in queue and "hidden or look-alike Unicode characters" in queue
        assert not [raw for raw in RAW if raw in queue + _terminal(app)]


@contextlib.asynccontextmanager
async def _queue_of(server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble, command: str,
                    size: tuple[int, int] = (120, 36)) -> AsyncIterator[tuple[AttachApp, Pilot[None], str]]:
    """`attach`'s queue open on alice's request to run `command` (the app, its pilot and the world)."""
    world = make_world(owner, llm_double)
    llm_double.queue(ToolCalls([("call_q", "shell_exec", json.dumps({"command": command}))]), Text("done"))
    app = AttachApp(server.url, world, server.token)
    async with app.run_test(size=size) as pilot:
        await _until(lambda: app.client.connected.is_set())
        owner.post(f"/api/worlds/{world}/messages", json={"content": "run it"})
        await _until(lambda: app.client.state.pending, what="the approval request")
        await pilot.press("ctrl+a")
        await pilot.pause()
        yield app, pilot, world


async def test_a_long_argument_is_read_to_its_end_before_o_approves(server: ServerProcess, owner: httpx.Client,
                                                                     llm_double: OpenAIDouble) -> None:
    head, tail = "echo harmless ", " ; rm -rf victim"
    command = head + "x" * (5000 - len(head) - len(tail)) + tail
    assert len(command) == 5000
    async with _queue_of(server, owner, llm_double, command) as (app, pilot, world):
        assert command in _queue_text(app).replace("\n", "")  # whole, never cut
        assert "victim" not in _terminal(app)  # its tail is below the pane: not yet read
        await pilot.press("o")
        await pilot.pause(0.3)
        assert app.sent == [] and _decisions(owner, world) == [] and app.client.state.pending
        await pilot.press("end")  # read on to the end of the request
        assert "victim" in _terminal(app)
        await pilot.press("o")
        await _until(lambda: _decisions(owner, world), what="the approval, once the whole request was read")
        assert [(d["decision"], d["scope"]) for d in _decisions(owner, world)] == [("approve", "once")]


async def test_look_alikes_the_server_found_are_shown_escaped_and_approving_once_asks_first(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    # `rm -rf victim` with a Cyrillic es (U+0441) in victim: to a reader the same text, to the shell another file.
    async with _queue_of(server, owner, llm_double, "rm -rf vi\u0441tim") as (app, pilot, world):
        queue = _queue_text(app)
        assert "vi\\u0441tim" in queue and "\u0441" not in queue + _terminal(app)
        assert "U+0441 CYRILLIC SMALL LETTER ES" in queue  # the server's warning names it
        await pilot.press("end")
        await pilot.press("o")
        await pilot.pause(0.3)
        assert app.sent == [] and _decisions(owner, world) == []  # asked first, as the page does
        await pilot.press("y")
        await _until(lambda: _decisions(owner, world), what="the approval, once confirmed")
        assert [(d["decision"], d["scope"]) for d in _decisions(owner, world)] == [("approve", "once")]
