"""`agent-world attach WORLD --url URL`: a terminal client on the JSON protocol (a Textual app).

The same safety rules as the page:
- an arriving approval request never takes focus or keystrokes: it only updates the queue bar;
- the queue opens on a deliberate act (ctrl+a, or a click on the bar), and single-key decisions
  exist only inside it, on the request that is selected (a request decided by someone else leaves
  nothing selected, so a key meant for it decides nothing else);
- "for this chat" and "always" ask for a confirmation that says what they allow;
- "edit & approve" (e) opens a form whose text field takes every key typed (edit.py): it decides only from
  its button, and refuses invalid JSON inline;
- nothing is sent while disconnected: the composer keeps its text and says so.
Everything from the server (agents, LLM output, tool output) is shown as plain text, never as markup, and
inert (inert.py): escape sequences in it are shown escaped, never sent to the terminal.
"""
from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from .client import Ack, Approval, ClientError, Fatal, NotConnected, ProtocolError, Scope, WorldClient
from .edit import EditScreen
from .inert import inert
from .lines import Conversation
from .queue import ConfirmScreen, QueueScreen, describe_scope

__all__ = ["AttachApp", "ConfirmScreen", "QueueScreen", "describe_scope"]

Frame = dict[str, Any]


def _widget_id(prefix: str, raw: str) -> str:
    return prefix + re.sub(r"[^A-Za-z0-9_-]", "_", raw)


class AttachApp(App[None]):
    """The live conversation, the agents' states and the approval queue of one world."""

    TITLE = "agent-world attach"
    CSS = """
    #main { height: 1fr; }
    #conversation { width: 3fr; border: round $primary; }
    #side { width: 1fr; }
    #agents { border: round $secondary; height: auto; min-height: 4; }
    #queue-bar { border: round $warning; height: auto; }
    #conn { height: 1; }
    .msg { margin-bottom: 1; }
    QueueScreen, ConfirmScreen { align: center middle; }
    #queue { width: 90%; height: 80%; border: thick $warning; background: $surface; }
    #queue-list { height: auto; max-height: 40%; }
    #queue-detail { height: 1fr; border-top: solid $warning; }
    #confirm { width: 70%; height: auto; border: thick $error; background: $surface; padding: 1 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("ctrl+a", "open_queue", "Approval queue", priority=True),
                Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(self, url: str, world: str, token: str, *, chat: str | None = None) -> None:
        super().__init__()
        self.client = WorldClient(url, world, token)
        self.world, self.chat = world, chat
        self.sent: list[Frame] = []  # what this app sent, for the record (and tests)
        self._texts: dict[str, str] = {}  # streamed text per message id, made inert
        self._shown: dict[str, None] = {}  # ids of messages shown whole (the last 1,000): their chunks are done
        self._seq_of: dict[str, int] = {}  # widget id -> the seq of the event it shows (a `reset` drops the later)
        self._lines = Conversation()

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield VerticalScroll(id="conversation")
            with Vertical(id="side"):
                yield Static("", id="agents")
                yield Static("", id="queue-bar")
        yield Static("connecting…", id="conn")
        yield Input(placeholder="Message the world (enter sends)", id="composer")
        yield Footer()

    @property
    def main_screen(self) -> Screen[Any]:
        """The screen with the conversation, whatever is shown over it (the queue, a confirmation)."""
        return self.screen_stack[0]

    def on_mount(self) -> None:
        self._conversation = self.query_one("#conversation", VerticalScroll)
        self._conversation.border_title = f"world {self.world}"
        self.query_one("#agents").border_title = "agents"
        self.query_one("#queue-bar").border_title = "approvals"
        self.query_one("#composer", Input).focus()
        self.refresh_side()
        self.listen()

    # The stream ---------------------------------------------------------------------------------------

    @work(exclusive=True, group="listen")
    async def listen(self) -> None:
        try:
            await self.client.start()
            self.set_connected(True)
            async for frame in self.client.frames():
                if not self._conversation.is_attached:  # the app is closing: its widgets are gone
                    return
                self.on_frame(frame)
        except Fatal as exc:
            self.set_connected(False, str(exc))
        except (OSError, ClientError, TimeoutError) as exc:
            self.set_connected(False, f"cannot connect: {exc}")

    def on_frame(self, frame: Frame) -> None:
        kind = frame["type"]
        if kind == "connection":
            self.set_connected(bool(frame["connected"]))
        elif kind == "event":
            self.show_event(frame["event"])
        elif kind == "chunk":
            self.show_chunk(frame)
        elif kind == "error":
            self.notify(inert(f"{frame.get('code')}: {frame.get('message')}"), severity="error", markup=False)
        elif kind == "reset":  # the storage lost the events after `after`: what came after is gone
            for key, seq in list(self._seq_of.items()):
                if seq > int(frame["after"]):
                    del self._seq_of[key]
                    self._conversation.query(f"#{key}").remove()
            self.notify(inert(frame.get("message")), severity="error", markup=False)
        if kind in ("snapshot", "status", "event", "presence"):
            self.refresh_side()

    def set_connected(self, up: bool, why: str = "") -> None:
        text = "● connected" if up else f"○ disconnected{': ' + inert(why) if why else ' (reconnecting…)'}"
        self.main_screen.query_one("#conn", Static).update(Text(text, style="green" if up else "red"))

    def _bubble(self, key: str) -> Static:
        found = self._conversation.query(f"#{key}")
        if found:
            return found.first(Static)
        bubble = Static("", id=key, classes="msg")
        self._conversation.mount(bubble)
        return bubble

    def show_chunk(self, frame: Frame) -> None:
        message_id = str(frame.get("message_id"))
        if message_id in self._shown:  # a chunk that came after (or again with) its whole message
            return
        if frame.get("reset"):
            self._texts[message_id] = ""
        # Kept inert as it grows (`inert` escapes character by character): each chunk costs its own length.
        self._texts[message_id] = self._texts.get(message_id, "") + inert(str(frame.get("delta") or ""))
        self._bubble(_widget_id("m-", message_id)).update(
            Text(f"{inert(frame.get('agent'))}: {self._texts[message_id]}▌"))
        self._conversation.scroll_end(animate=False)

    def show_event(self, event: Frame) -> None:
        line = self._lines.line(event)
        if line is None or (self.chat and event.get("chat") not in (None, self.chat)):
            return
        key = _widget_id("m-", str(event["id"])) if event.get("id") else f"e-{event['seq']}"
        if event.get("id"):
            self._texts.pop(str(event["id"]), None)
            self._shown[str(event["id"])] = None
            if len(self._shown) > 1000:
                del self._shown[next(iter(self._shown))]
        self._bubble(key).update(Text(line))
        self._seq_of[key] = int(event["seq"])
        self._conversation.scroll_end(animate=False)

    def client_pending(self) -> list[Approval]:
        return list(self.client.state.pending.values())

    def refresh_side(self) -> None:
        agents = Text()
        for name, agent in self.client.state.agents.items():
            status = agent.get("status") or {}
            state = status.get("state", "idle")
            detail = f" ({inert(status['tool'])})" if status.get("tool") else ""
            agents.append(f"{inert(name)}: {inert(state)}{detail}\n")
        self.main_screen.query_one("#agents", Static).update(agents or Text("no agents"))
        n = len(self.client.state.pending)
        bar = Text(f"{n} pending — ctrl+a opens the queue" if n else "no pending approvals",
                   style="bold yellow" if n else "")
        self.main_screen.query_one("#queue-bar", Static).update(bar)
        if isinstance(self.screen, QueueScreen):
            self.screen.refresh_list()

    # Acts ---------------------------------------------------------------------------------------------

    def action_open_queue(self) -> None:
        if isinstance(self.screen, QueueScreen | ConfirmScreen | EditScreen):
            return
        pending = self.client_pending()
        self.push_screen(QueueScreen(pending[0].id if pending else None))

    def on_click(self, event: events.Click) -> None:
        if event.widget is not None and event.widget.id == "queue-bar":
            self.action_open_queue()

    async def on_input_submitted(self, message: Input.Submitted) -> None:
        text = message.value.strip()
        if text and await self._sent(lambda: self.client.say(text, self.chat), "Not sent"):
            self.sent.append({"say": text})
            message.input.value = ""

    async def _sent(self, act: Callable[[], Awaitable[Ack]], failure: str) -> bool:
        """Run one send; say why when nothing was sent (never while disconnected)."""
        if not self.client.connected.is_set():
            self.notify("Not connected: nothing was sent.", severity="error")
            return False
        try:
            await act()
        except NotConnected:
            self.notify("Not connected: nothing was sent.", severity="error")
            return False
        except (ProtocolError, TimeoutError) as exc:
            self.notify(f"{failure}: {inert(exc)}", severity="error", markup=False)
            return False
        return True

    def send_decision(self, approval: Approval, decision: Literal["approve", "deny"], scope: Scope,
                      arguments: dict[str, Any] | None = None) -> None:
        self._decide(approval, decision, scope, arguments)

    @work(group="decide")
    async def _decide(self, approval: Approval, decision: Literal["approve", "deny"], scope: Scope,
                      arguments: dict[str, Any] | None) -> None:
        if await self._sent(lambda: self.client.decide(approval.id, decision, scope, arguments=arguments),
                            "Not decided"):
            edited = f", edited: {inert(', '.join(arguments))}" if arguments else ""
            self.sent.append({"decision": decision, "scope": scope, "approval": approval.id}
                             | ({"arguments": arguments} if arguments else {}))
            self.notify(f"{decision} ({scope}{edited}): {inert(approval.tool)} for {inert(approval.agent)}",
                        markup=False)

    async def on_unmount(self) -> None:
        await self.client.close()


def run(url: str, world: str, token: str, chat: str | None = None) -> int:
    AttachApp(url, world, token, chat=chat).run()
    return 0
