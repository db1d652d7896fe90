"""The terminal client's approval queue, opened on purpose, and the confirmation of a wide scope.

Nothing is cut before a decision (issue #28, item 8): the selected request's arguments are shown whole,
wrapped, in a pane of their own, and an approving key acts only once that pane has been seen to its end
(pgdn/space/end scroll it); a denial needs nothing read. Every text from the server is inert (inert.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from .client import Approval, Scope
from .edit import EditScreen
from .inert import has_hidden, inert, inert_json
from .lines import short

if TYPE_CHECKING:
    from .tui import AttachApp

__all__ = ["CHOICES", "ConfirmScreen", "QueueScreen", "describe_scope"]

CHOICES: dict[str, tuple[str, Literal["approve", "deny"], Scope]] = {
    "o": ("approve_once", "approve", "once"), "s": ("approve_session", "approve", "session"),
    "a": ("approve_always", "approve", "always"), "d": ("deny", "deny", "once")}


def describe_scope(approval: Approval, scope: str) -> str:
    """What a wide approval allows, in words (the confirmation shows it)."""
    agent, tool = inert(approval.agent), inert(approval.tool)
    if scope == "session":
        return (f"Allow {agent} to run {tool} in chat {inert(approval.chat)} from now on, "
                f"without asking again?")
    return f"Allow every agent to run {tool} in this world from now on (a world rule), without asking again?"


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
        Binding("pagedown,space", "page(1)", "Read on"), Binding("pageup", "page(-1)", "Back"),
        Binding("end", "to_end", "To the end", show=False), Binding("home", "to_start", "To the start", show=False),
        *[Binding(key, f"decide('{key}')", choice[0].replace("_", " ")) for key, choice in CHOICES.items()],
        Binding("e", "edit", "edit & approve")]

    def __init__(self, selected: str | None = None) -> None:
        super().__init__()
        # Chosen when it is opened, not once mounted: a key pressed right after ctrl+a may come first.
        self.selected = selected
        self.read: set[str] = set()  # requests whose arguments were on screen to their end
        self._shown: str | None = None  # the request whose arguments the pane holds now

    @property
    def attach(self) -> AttachApp:
        from .tui import AttachApp  # the app imports this module
        assert isinstance(self.app, AttachApp)
        return self.app

    def compose(self) -> ComposeResult:
        with Vertical(id="queue"):
            yield Static("", id="queue-list")
            with VerticalScroll(id="queue-detail"):
                yield Static("", id="queue-args")
            yield Static("↑/↓ select   pgdn/space/end: read on   o: approve once   e: edit & approve   "
                         "s: for this chat   a: always   d: deny   esc: close", id="queue-help")
            yield Footer()

    def on_mount(self) -> None:
        self.refresh_list()
        self.watch(self.query_one("#queue-detail", VerticalScroll), "scroll_y", self._scrolled, init=False)

    def refresh_list(self) -> None:
        pending = self.attach.client_pending()
        if self.selected is not None and self.selected not in {a.id for a in pending}:
            self.selected = None  # decided elsewhere: select again on purpose
        if not (self.query("#queue-list") and self.query("#queue-args")):
            return  # not all composed yet (the detail pane mounts after the list): on_mount draws it
        text = Text()
        if not pending:
            text.append("No pending approvals.")
        for approval in pending:
            mark = "▶ " if approval.id == self.selected else "  "
            preview = short(approval.arguments, 100, approval.hidden)
            text.append(f"{mark}{inert(approval.agent)} · {inert(approval.tool)} {preview}\n",
                        style="reverse" if approval.id == self.selected else "")
            if approval.required > 1:
                names = ", ".join(inert(name) for name in approval.approved_by) or "nobody yet"
                text.append(f"    {len(approval.approved_by)} of {approval.required} approvals: {names}\n")
        self.query_one("#queue-list", Static).update(text)
        self._show_detail(next((a for a in pending if a.id == self.selected), None))

    def _show_detail(self, approval: Approval | None) -> None:
        """The selected request whole: its arguments wrapped, never cut, its message and options."""
        shown = approval.id if approval else None
        if shown == self._shown:
            return  # the same request: keep where the person is reading
        self._shown = shown
        text = Text()
        if approval is None:
            text.append("Select a request (↑/↓) to read it whole." if self.attach.client_pending() else "")
        else:
            arguments = inert_json(approval.arguments, indent=2, also=approval.hidden)
            text.append(f"{inert(approval.agent)} asks to run {inert(approval.tool)} with:\n", style="bold")
            if approval.warning or has_hidden(approval.arguments):
                warning = approval.warning or "Hidden characters in the arguments are shown escaped."
                text.append(f"⚠ {inert(warning)}\n", style="bold red")
            text.append(arguments + "\n")
            if approval.message:
                text.append(f"\n{inert(approval.message)}\n")
            text.append(f"\noptions: {', '.join(inert(o) for o in approval.options)}\n")
            text.append("— end of the request —", style="dim")
        self.query_one("#queue-args", Static).update(text)
        detail = self.query_one("#queue-detail", VerticalScroll)
        detail.scroll_home(animate=False)
        self.call_after_refresh(self._check_read)  # once laid out: does it all fit?

    def _scrolled(self, _: float) -> None:
        self.call_after_refresh(self._check_read)

    def _check_read(self) -> None:
        """Counts the shown request as read once its pane, laid out, is scrolled to the end (or fits)."""
        detail = self.query("#queue-detail")
        if self._shown is not None and detail:
            pane = detail.first(VerticalScroll)
            if pane.scroll_y >= pane.max_scroll_y:
                self.read.add(self._shown)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_move(self, step: int) -> None:
        ids = [a.id for a in self.attach.client_pending()]
        if ids:
            index = ids.index(self.selected) + step if self.selected in ids else (0 if step > 0 else len(ids) - 1)
            self.selected = ids[max(0, min(len(ids) - 1, index))]
        self.refresh_list()

    def action_page(self, step: int) -> None:
        detail = self.query_one("#queue-detail", VerticalScroll)
        (detail.scroll_page_down if step > 0 else detail.scroll_page_up)(animate=False)

    def action_to_end(self) -> None:
        self.query_one("#queue-detail", VerticalScroll).scroll_end(animate=False)

    def action_to_start(self) -> None:
        self.query_one("#queue-detail", VerticalScroll).scroll_home(animate=False)

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
        if decision == "approve" and approval.id not in self.read:
            # Approving what was never on screen is how a tail past the first lines got approved.
            self.notify("Read the whole request first: pgdn, space or end scrolls to its end.", severity="warning")
            return
        disguised = decision == "approve" and (approval.warning or has_hidden(approval.arguments))
        if scope == "once" and not disguised:
            self.attach.send_decision(approval, decision, scope)
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.attach.send_decision(approval, decision, scope)

        # A call with hidden characters is confirmed even once, as on the page: what runs is not what shows.
        question = describe_scope(approval, scope) if scope != "once" else (
            f"Approve {inert(approval.tool)} once, with the hidden characters shown escaped above?")
        self.app.push_screen(ConfirmScreen(question), confirmed)
