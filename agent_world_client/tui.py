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
Everything from the server (agents, LLM output, tool output) is shown as plain text, never as markup.
"""
from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, Static

from .client import Ack, Approval, ClientError, Fatal, NotConnected, ProtocolError, Scope, WorldClient
from .edit import EditScreen

__all__ = ["AttachApp", "ConfirmScreen", "QueueScreen", "describe_scope"]

Frame = dict[str, Any]
CHOICES: dict[str, tuple[str, Literal["approve", "deny"], Scope]] = {
    "o": ("approve_once", "approve", "once"), "s": ("approve_session", "approve", "session"),
    "a": ("approve_always", "approve", "always"), "d": ("deny", "deny", "once")}


def _widget_id(prefix: str, raw: str) -> str:
    return prefix + re.sub(r"[^A-Za-z0-9_-]", "_", raw)


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_scope(approval: Approval, scope: str) -> str:
    """What a wide approval allows, in words (the confirmation shows it)."""
    if scope == "session":
        return (f"Allow {approval.agent} to run {approval.tool} in chat {approval.chat} from now on, "
                f"without asking again?")
    return f"Allow every agent to run {approval.tool} in this world from now on (a world rule), without asking again?"


def render_event(event: Frame) -> str | None:
    """One line (or a few) for an event of the conversation; None for what the conversation does not show."""
    kind = event.get("kind")
    if kind == "notice":
        return f"· {event.get('text', '')}"
    if kind == "agent_error":
        return f"! {event.get('message', '')}"
    if kind != "message":
        return None
    sender = event.get("sender") or "?"
    if approval := Approval.from_event(event):
        return f"⚠ {approval.agent} asks to run {approval.tool} {_short(approval.arguments)}"
    if event.get("role") == "tool":
        decision = event.get("decision")
        if isinstance(decision, dict):
            verb = "approved" if decision.get("decision") == "approve" else "denied"
            mark = "✓" if verb == "approved" else "✗"
            count = f", {len(decision['voters'])} of {decision['required']}" if decision.get("voters") else ""
            edited = f", edited: {', '.join(decision['changed'])}" if decision.get("changed") else ""
            return f"{mark} {sender} {verb} {decision.get('tool')} ({decision.get('scope')}{count}{edited})"
        edit = event.get("edited")
        by = f" (edited by {edit.get('by')}: {', '.join(edit.get('changed') or [])})" if isinstance(edit, dict) else ""
        return f"← {event.get('name') or 'result'}{by}: {_short(event.get('content') or '', 200)}"
    lines = [f"{sender}: {event.get('content') or ''}".rstrip()] if event.get("content") else []
    for call in event.get("tool_calls") or []:
        fn = call.get("function", {})
        lines.append(f"→ {fn.get('name')} {_short(fn.get('arguments', ''), 200)}")
    return "\n".join(lines) or f"{sender}: (no text)"


class ConfirmScreen(ModalScreen[bool]):
    """Says what a wide approval allows; y confirms, n/escape cancels."""

    # Only "y" confirms (not enter, which a person typing a message may press by habit).
    BINDINGS: ClassVar[list[BindingType]] = [Binding("y", "answer(True)", "Yes, allow"),
                                             Binding("n,escape", "answer(False)", "No")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(Text(self.text), id="confirm-text")
            yield Static("y: yes, allow    n / escape: no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class QueueScreen(ModalScreen[None]):
    """The approval queue, opened on purpose. o/s/a/d decide the selected request, e edits it; ↑/↓ select."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,ctrl+a", "close", "Close"), Binding("up,k", "move(-1)", "Up"),
        Binding("down,j", "move(1)", "Down"),
                *[Binding(key, f"decide('{key}')", choice[0].replace("_", " ")) for key, choice in CHOICES.items()],
        Binding("e", "edit", "edit & approve")]

    def __init__(self, selected: str | None = None) -> None:
        super().__init__()
        # Chosen when it is opened, not once mounted: a key pressed right after ctrl+a may come first.
        self.selected = selected

    @property
    def attach(self) -> AttachApp:
        assert isinstance(self.app, AttachApp)
        return self.app

    def compose(self) -> ComposeResult:
        with Vertical(id="queue"):
            yield Static("", id="queue-list")
            yield Static("↑/↓ select   o: approve once   e: edit & approve   s: for this chat   a: always   d: deny   "
                         "esc: close",
                         id="queue-help")
            yield Footer()

    def on_mount(self) -> None:
        self.refresh_list()

    def refresh_list(self) -> None:
        pending = self.attach.client_pending()
        if self.selected is not None and self.selected not in {a.id for a in pending}:
            self.selected = None  # decided elsewhere: select again on purpose
        shown = self.query("#queue-list")
        if not shown:
            return  # not composed yet: on_mount draws it
        text = Text()
        if not pending:
            text.append("No pending approvals.")
        for approval in pending:
            mark = "▶ " if approval.id == self.selected else "  "
            text.append(f"{mark}{approval.agent} · {approval.tool} {_short(approval.arguments, 200)}\n",
                        style="reverse" if approval.id == self.selected else "")
            if approval.message:
                text.append(f"    {_short(approval.message, 200)}\n")
            if approval.required > 1:
                who = ", ".join(approval.approved_by) or "nobody yet"
                text.append(f"    {len(approval.approved_by)} of {approval.required} approvals: {who}\n")
            text.append(f"    options: {', '.join(approval.options)}\n")
        shown.first(Static).update(text)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_move(self, step: int) -> None:
        ids = [a.id for a in self.attach.client_pending()]
        if ids:
            index = ids.index(self.selected) + step if self.selected in ids else (0 if step > 0 else len(ids) - 1)
            self.selected = ids[max(0, min(len(ids) - 1, index))]
        self.refresh_list()

    def _selected(self) -> Approval | None:
        approval = next((a for a in self.attach.client_pending() if a.id == self.selected), None)
        if approval is None:
            # Decided elsewhere before this screen heard of it (its frame is still on its way): show the
            # queue as it is now, with nothing selected, rather than wait for the frame.
            self.refresh_list()
            self.notify("Select a request first (↑/↓).", severity="warning")
        return approval

    def action_edit(self) -> None:
        approval = self._selected()
        if approval is None:
            return
        if "approve_once" not in approval.options or approval.required > 1:
            self.notify("This request cannot be edited: approve or deny it as asked.", severity="warning")
            return

        def edited(arguments: dict[str, Any] | None) -> None:
            if arguments is None:
                return
            if approval.id not in {a.id for a in self.attach.client_pending()}:
                self.notify("Decided by someone else meanwhile: nothing was sent.", severity="warning")
                return
            self.attach.send_decision(approval, "approve", "once", arguments)

        self.app.push_screen(EditScreen(approval), edited)

    def action_decide(self, key: str) -> None:
        approval = self._selected()
        if approval is None:
            return
        option, decision, scope = CHOICES[key]
        if option not in approval.options:
            self.notify(f"{option.replace('_', ' ')} is not offered for this request.", severity="warning")
            return
        if scope == "once":
            self.attach.send_decision(approval, decision, scope)
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.attach.send_decision(approval, decision, scope)

        self.app.push_screen(ConfirmScreen(describe_scope(approval, scope)), confirmed)


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
    #confirm { width: 70%; height: auto; border: thick $error; background: $surface; padding: 1 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("ctrl+a", "open_queue", "Approval queue", priority=True),
                Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(self, url: str, world: str, token: str, *, chat: str | None = None) -> None:
        super().__init__()
        self.client = WorldClient(url, world, token)
        self.world, self.chat = world, chat
        self.sent: list[Frame] = []  # what this app sent, for the record (and tests)
        self._texts: dict[str, str] = {}  # streamed text per message id
        self._shown: dict[str, None] = {}  # ids of messages shown whole (the last 1,000): their chunks are done
        self._seq_of: dict[str, int] = {}  # widget id -> the seq of the event it shows (a `reset` drops the later)

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
            self.notify(f"{frame.get('code')}: {frame.get('message')}", severity="error")
        elif kind == "reset":  # the storage lost the events after `after`: what came after is gone
            for key, seq in list(self._seq_of.items()):
                if seq > int(frame["after"]):
                    del self._seq_of[key]
                    self._conversation.query(f"#{key}").remove()
            self.notify(str(frame.get("message")), severity="error")
        if kind in ("snapshot", "status", "event", "presence"):
            self.refresh_side()

    def set_connected(self, up: bool, why: str = "") -> None:
        text = "● connected" if up else f"○ disconnected{': ' + why if why else ' (reconnecting…)'}"
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
        self._texts[message_id] = self._texts.get(message_id, "") + str(frame.get("delta") or "")
        self._bubble(_widget_id("m-", message_id)).update(Text(f"{frame.get('agent')}: {self._texts[message_id]}▌"))
        self._conversation.scroll_end(animate=False)

    def show_event(self, event: Frame) -> None:
        line = render_event(event)
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
            detail = f" ({status['tool']})" if status.get("tool") else ""
            agents.append(f"{name}: {state}{detail}\n")
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
            self.notify(f"{failure}: {exc}", severity="error")
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
            edited = f", edited: {', '.join(arguments)}" if arguments else ""
            self.sent.append({"decision": decision, "scope": scope, "approval": approval.id}
                             | ({"arguments": arguments} if arguments else {}))
            self.notify(f"{decision} ({scope}{edited}): {approval.tool} for {approval.agent}")

    async def on_unmount(self) -> None:
        await self.client.close()


def run(url: str, world: str, token: str, chat: str | None = None) -> int:
    AttachApp(url, world, token, chat=chat).run()
    return 0
