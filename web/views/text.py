"""What every view shows alike: values as text, who said it, message pieces with hidden characters marked."""
from __future__ import annotations

import json
from typing import Any

from pygments.formatters import HtmlFormatter  # type: ignore[import-untyped]

from server import vocab
from server.hidden_text import describe, hidden_pieces, piece_char
from server.redact import REDACTED, redact

LINE_FORMATTER = HtmlFormatter(nowrap=True)  # token spans only: app.css colours `.highlight` for both themes

FOLD_CHARS = 400  # longer tool arguments and results are folded into a <details>
# Characters of a tool's result a page shows: a 16 MiB MCP result is the log's to keep (export, `/events`),
# not every open page's to render and hold.
SHOWN_RESULT = 100_000
FOLD_LINES = 8
STATE_LABELS = {vocab.IDLE: "idle", vocab.THINKING: "thinking", "streaming": "streaming",
                vocab.WAITING_APPROVAL: "waiting for approval", vocab.RUNNING_TOOL: "running a tool",
                vocab.ERROR: "error", "waiting_client": "waiting for the page"}
OPTION_KEYS = {"deny": "d", "approve_once": "o", "approve_session": "s", "approve_for": "f", "approve_always": "a"}


def pretty(value: Any) -> str:
    """JSON for people: indented, non-ASCII kept."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def json_value(text: object) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def folded(text: str) -> bool:
    return len(text) > FOLD_CHARS or text.count("\n") >= FOLD_LINES


def arguments_text(raw: object) -> str:
    """A tool call's arguments, redacted and indented when they are JSON, as written otherwise."""
    parsed = json_value(raw)
    if isinstance(parsed, dict):
        return pretty(redact(parsed))
    return raw if isinstance(raw, str) else ""


def who(sender: object) -> str:
    """The name to show for an event's `sender`."""
    text = sender if isinstance(sender, str) else ""
    return vocab.member_of(text) or text or "someone"


def is_approval_request(event: vocab.Event) -> bool:
    calls: list[Any] = event.get("tool_calls") or []
    return (event.get("kind") == vocab.MESSAGE and event.get("role") == "assistant"
            and event.get("sender") == vocab.SERVER_SENDER and len(calls) == 1
            and calls[0].get("function", {}).get("name") == vocab.REQUEST_APPROVAL)


def text_pieces(text: str) -> list[tuple[str, str | None, str]]:
    """`text` cut into (piece, mark, title): mark "redacted" where the server hid a value from this page,
    "hidden-char" for a character shown by its escape (server/hidden_text.py), None for text as it is."""
    out: list[tuple[str, str | None, str]] = []
    for i, part in enumerate(text.split(REDACTED)):
        if i:
            out.append((REDACTED, "redacted", "hidden by the server: a secret-looking value"))
        for piece, kind in hidden_pieces(part):
            out.append((piece, "hidden-char", f"{describe(piece_char(piece))}: {kind}, shown escaped") if kind
                       else (piece, None, ""))
    return out


def message_pieces(message: object) -> list[tuple[str, str | None, str]]:
    """A request's note (the LLM's, or an MCP server's question) as pieces: untrusted text, whose hidden
    characters are shown escaped as its arguments' are."""
    return text_pieces(str(message or ""))
