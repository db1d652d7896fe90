"""Edit & approve in the terminal client: change a call's arguments, then approve the changed call once.

Opened from the queue (`e`) on the selected request. The arguments are an editable JSON text; every key
typed there only edits it (enter is a new line, tab indents), so nothing is decided while typing. Leaving
the text (escape) lands on "Approve edited", which approves on enter or a click; escape again cancels.
Invalid JSON is refused inline, and nothing is sent. Only the arguments that changed are sent: the engine
merges them over the call's own (docs/protocol.md §4), so a value shown as `[redacted]` can stay as it is.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static, TextArea

from .client import Approval
from .inert import inert, inert_json

__all__ = ["EditScreen", "edited_arguments"]


def edited_arguments(original: dict[str, Any], text: str) -> dict[str, Any] | str:
    """The arguments that `text` changes (to send as the decision's `arguments`), or why it cannot be sent."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    if not isinstance(parsed, dict):
        return "the arguments must be a JSON object"
    if removed := sorted(set(original) - set(parsed)):
        return f"an edit cannot remove an argument ({', '.join(removed)}): it is merged over the call's own"
    changed = {key: value for key, value in parsed.items() if key not in original or original[key] != value}
    return changed or "nothing edited: approve it as it is from the queue (o)"


class EditScreen(ModalScreen[dict[str, Any] | None]):
    """The edit form of one request; dismissed with the changed arguments, or None when cancelled."""

    DEFAULT_CSS = """
    EditScreen { align: center middle; }
    #edit { width: 90%; height: 85%; border: thick $accent; background: $surface; padding: 0 1; }
    #edit-args { height: 1fr; }
    #edit-status { height: auto; margin: 1 0 0 0; }
    #edit-buttons { height: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]  # outside the text only

    def __init__(self, approval: Approval) -> None:
        super().__init__()
        self.approval = approval

    def compose(self) -> ComposeResult:
        with Vertical(id="edit"):
            yield Static(Text(f"Edit & approve once: {inert(self.approval.agent)} · {inert(self.approval.tool)}",
                              style="bold"), id="edit-title")
            # Hidden characters as JSON escapes: shown, and the text still parses to the same arguments.
            yield TextArea(inert_json(self.approval.arguments, indent=2, also=self.approval.hidden), id="edit-args",
                           tab_behavior="indent", soft_wrap=True)
            yield Static("", id="edit-status")
            with Horizontal(id="edit-buttons"):
                yield Button("Approve edited (once)", id="edit-approve", variant="warning")
                yield Button("Cancel", id="edit-cancel")
            yield Static("typing edits the arguments · esc: leave the text · then enter on “Approve edited” · "
                         "esc again: cancel", id="edit-help")

    def on_mount(self) -> None:
        self.query_one("#edit-args", TextArea).focus()
        self.show_status()

    def result(self) -> dict[str, Any] | str:
        return edited_arguments(self.approval.arguments, self.query_one("#edit-args", TextArea).text)

    def show_status(self) -> None:
        """Says, as the text changes, what would be sent: the edited arguments, or why nothing can be."""
        result = self.result()
        if isinstance(result, str):
            line = Text(result, style="red" if result.startswith(("invalid", "the arguments", "an edit")) else "")
        else:
            line = Text(f"edited: {', '.join(result)}", style="bold yellow")
        self.query_one("#edit-status", Static).update(line)

    def on_text_area_changed(self, _: TextArea.Changed) -> None:
        self.show_status()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "edit-cancel":
            self.dismiss(None)
            return
        result = self.result()
        self.show_status()
        if isinstance(result, str):  # refused here, inline: nothing is sent
            self.query_one("#edit-args", TextArea).focus()
            return
        self.dismiss(result)

    def action_cancel(self) -> None:
        self.dismiss(None)
