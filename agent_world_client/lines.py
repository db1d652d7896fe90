"""What the terminal client's conversation says of each event: one line (or a few) of inert text.

Every string from the server goes through `inert` (inert.py) here. A step says what ran (issue #28, item 7):
a call a person edited before approving reads "ran `X` (edited by owner from `Y`)", and a call that was
denied or timed out reads so, never "ran".
"""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from .client import Approval
from .inert import inert, inert_json

__all__ = ["Conversation", "call_text", "short"]

Frame = dict[str, Any]
_NOT_RUN = ("denied", "timed_out")  # a result's `not_run`: its call never ran (docs/protocol.md §4)


def short(value: Any, limit: int = 300, also: frozenset[str] = frozenset()) -> str:
    """A preview of untrusted text or JSON, inert (`also`: more characters to escape), cut at `limit`."""
    text = inert_json(value, also=also)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def who(sender: object) -> str:
    """A person's name for a `sender` (`human:<name>`), else the sender as it is."""
    text = sender if isinstance(sender, str) else "someone"
    return inert(text.removeprefix("human:"))


def _parsed(arguments: object) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def call_text(arguments: object, limit: int = 200) -> str:
    """What a call runs, as a step quotes it: the command (or path, url) when it has one, else its JSON."""
    parsed = _parsed(arguments)
    if isinstance(parsed, dict):
        for key in ("command", "path", "url", "query"):
            if isinstance(parsed.get(key), str):
                return short(parsed[key], limit)
    return short(parsed, limit)


def _denial(content: object, event: Frame) -> str | None:
    """Why the call of a result never ran (a person's or a rule's denial, a timeout), or None if it ran."""
    if event.get("not_run") not in _NOT_RUN:
        return None
    parsed = _parsed(content)
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return error if isinstance(error, str) else str(event["not_run"])


class Conversation:
    """Renders events, remembering each call's arguments as asked (the last 1,000) to name what an edit changed."""

    def __init__(self) -> None:
        self._asked: OrderedDict[str, Any] = OrderedDict()

    def _remember(self, call_id: object, arguments: object) -> None:
        if isinstance(call_id, str):
            self._asked[call_id] = _parsed(arguments)
            if len(self._asked) > 1000:
                self._asked.popitem(last=False)

    def line(self, event: Frame) -> str | None:
        """The text for an event of the conversation; None for what the conversation does not show."""
        kind = event.get("kind")
        if kind == "notice":
            return f"· {inert(event.get('text', ''))}"
        if kind == "agent_error":
            return f"! {inert(event.get('message', ''))}"
        if kind != "message":
            return None
        sender = inert(event.get("sender") or "?")
        if approval := Approval.from_event(event):
            return f"⚠ {inert(approval.agent)} asks to run {inert(approval.tool)} {short(approval.arguments)}"
        if event.get("role") == "tool":
            return self._tool_line(event, sender)
        lines = [f"{sender}: {inert(event.get('content') or '')}".rstrip()] if event.get("content") else []
        for call in event.get("tool_calls") or []:
            fn = call.get("function", {})
            self._remember(call.get("id"), fn.get("arguments", ""))
            lines.append(f"→ {inert(fn.get('name'))} {short(fn.get('arguments', ''), 200)}")
        return "\n".join(lines) or f"{sender}: (no text)"

    def _tool_line(self, event: Frame, sender: str) -> str:
        decision = event.get("decision")
        if isinstance(decision, dict):
            verb = "approved" if decision.get("decision") == "approve" else "denied"
            mark = "✓" if verb == "approved" else "✗"
            count = f", {len(decision['voters'])} of {decision['required']}" if decision.get("voters") else ""
            edited = f", edited: {inert(', '.join(decision['changed']))}" if decision.get("changed") else ""
            if isinstance(decision.get("original"), dict):  # what was asked, should the result come later
                call = str(event.get("tool_call_id") or "").removeprefix("approval_")
                self._asked.setdefault(call, decision["original"])
            scope = inert(decision.get("scope"))
            return f"{mark} {sender} {verb} {inert(decision.get('tool'))} ({scope}{count}{edited})"
        name, content = inert(event.get("name") or "result"), event.get("content") or ""
        asked = self._asked.get(str(event.get("tool_call_id")))
        if (why := _denial(content, event)) is not None:
            what = f" `{call_text(asked)}`" if asked is not None else ""
            return f"✗ {name}{what} not run: {inert(why)}"
        edit = event.get("edited")
        if isinstance(edit, dict):
            ran = call_text(edit.get("arguments"))
            before = call_text(asked) if asked is not None else None
            source = (f" from `{before}`" if before is not None and before != ran
                      else f": {inert(', '.join(edit.get('changed') or []))}")
            return f"← {name} ran `{ran}` (edited by {who(edit.get('by'))}{source}): {short(content, 200)}"
        what = f" `{call_text(asked)}`" if asked is not None else ""
        return f"← {name} ran{what}: {short(content, 200)}"
