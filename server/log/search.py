"""Search in a world's log (issue #31 item 8): what every backend shares.

A search looks at the newest `SEARCH_WINDOW` events of a world at most, newest first, and returns the
messages whose text or tool calls contain the query (case-insensitive for ASCII letters, as SQLite's
LIKE and Lua's `string.lower` are; other letters match as written). Neither backend keeps a text index:
each narrows the window down in the storage itself, on the stored JSON (`needle`), in steps bounded by
events and by bytes, and `matches` then keeps only the events whose searchable fields hold the query (not
its keys, ids or other metadata) in the form the caller shows them (the engine: `public`, so a match only
inside a hidden value neither counts toward the limit nor shows).
"""
from __future__ import annotations

import orjson

from .. import vocab
from ..vocab import Event

SEARCH_WINDOW = 200_000  # events (of one world) a search looks through at most, the newest
SEARCH_CHUNK = 5_000  # events looked at per step at most: in Redis, one script call (keeps each one short)
# Bytes of stored events one step looks through at most (at least one event, however large: 32 MiB as
# stored): a step over a few large tool results stops early and the next one goes on from there, so
# no script holds Redis, and no LIKE holds one of SQLite's read threads, for long whatever the events' sizes.
SEARCH_STEP_BYTES = 4 * 2**20
MAX_QUERY = 200  # characters of a query
MAX_RESULTS = 200


def needle(query: str) -> str:
    """The query as it appears inside the stored JSON (quotes, backslashes and controls escaped), lowercased."""
    return orjson.dumps(query).decode()[1:-1].lower()


def _lower_ascii(text: str) -> str:
    return text.translate(_ASCII_LOWER)


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def searchable(event: Event) -> list[str]:
    """The text of a message a search looks at: its content, its tool calls' names and arguments."""
    if event.get("kind", vocab.MESSAGE) != vocab.MESSAGE:
        return []
    out: list[str] = []
    content = event.get("content")
    if isinstance(content, str):
        out.append(content)
    elif isinstance(content, list):
        out += [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
    for call in event.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out += [v for v in (function.get("name"), function.get("arguments")) if isinstance(v, str)]
    return out


def matches(event: Event, query: str, chat: str | None = None) -> bool:
    """Whether `event` (a message of `chat`, when given) holds `query` in its searchable text."""
    if chat is not None and event.get("chat") != chat:
        return False
    wanted = _lower_ascii(query)
    return any(wanted in _lower_ascii(text) for text in searchable(event))
