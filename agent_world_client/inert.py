"""Untrusted text made inert before the terminal client shows it (issue #28, item 8).

Everything the server relays (agents' text, tool output, arguments, names, chat titles, error messages)
may carry terminal control sequences: OSC 52 writes the clipboard, OSC 0 the window title, CSI moves the
cursor or makes the terminal type an answer into stdin. Rich drops only a few C0 codes and Textual writes
the rest as they are. So every string from the server passes `inert`, which shows each control character
(C0 but newline and tab, DEL, C1), format character (bidi controls, zero-width ones) and line or paragraph
separator by its escape (`\\x1b`, `\\u202e`): with its ESC escaped a sequence is plain text, and a reader
sees that something was there.
"""
from __future__ import annotations

import json
import unicodedata
from typing import Any

__all__ = ["has_hidden", "inert", "inert_json"]

_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})
# Invisible though of other categories (as the server's hidden_text.py counts them): Hangul fillers, the
# blank braille cell, the combining grapheme joiner, Khmer and Mongolian invisible marks.
_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u17b4\u17b5\u180b\u180c\u180d\u180f")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _hidden(ch: str, also: frozenset[str] = frozenset()) -> bool:
    return ch in also or ch in _INVISIBLE or (ch not in "\n\t " and unicodedata.category(ch) in _HIDDEN)


def has_hidden(value: Any, also: frozenset[str] = frozenset()) -> bool:
    """Whether text, or any string (or key) of a JSON value, holds a character `inert` escapes (or one of
    `also`: the look-alikes the server found in a request, `hiddenCharacters`)."""
    if isinstance(value, str):
        return (not value.isprintable() or not also.isdisjoint(value) or not _INVISIBLE.isdisjoint(value)) and any(
            _hidden(ch, also) for ch in value)
    if isinstance(value, dict):
        return any(has_hidden(key, also) or has_hidden(item, also) for key, item in value.items())
    return isinstance(value, list) and any(has_hidden(item, also) for item in value)


def inert(value: object) -> str:
    """`value` as text a terminal only displays: the one way untrusted text reaches the screen."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and _INVISIBLE.isdisjoint(text):  # the common case, at C speed: nothing to escape
        return text
    return "".join(_escape(ch) if _hidden(ch) else ch for ch in text)


def inert_json(value: Any, indent: int | None = None, also: frozenset[str] = frozenset()) -> str:
    """A JSON value (a call's arguments) as inert JSON text: non-ASCII kept, hidden characters (and those
    of `also`) as JSON escapes (`\\u202e`), so the text still parses to the same value (the edit form
    relies on it). Text that is not JSON already (an LLM's raw arguments) is only made inert."""
    if isinstance(value, str):
        return inert(value)
    text = json.dumps(value, ensure_ascii=False, indent=indent)
    if not has_hidden(text, also):
        return text
    # Outside its strings JSON text is ASCII: each hidden character is inside a string, where an escape is valid.
    return "".join(json.dumps(ch, ensure_ascii=True)[1:-1] if _hidden(ch, also) else ch for ch in text)
