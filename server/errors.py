"""Errors split by audience: `AppError` goes back to a client (HTTP status, WebSocket error frame)."""
from __future__ import annotations

from typing import Any

from . import vocab

_STATUS: dict[str, int] = {
    vocab.NOT_FOUND: 404,
    vocab.FORBIDDEN: 403,
    vocab.INVALID: 400,
    vocab.UNKNOWN_TOOL_CALL: 404,
    vocab.ALREADY_DECIDED: 409,
    vocab.NOT_CLIENT_CALL: 409,
    vocab.CONFLICT: 409,
}


class AppError(Exception):
    """A refusal the client should see: a stable `code`, a human `message`, an HTTP `status`."""

    def __init__(self, code: str, message: str, status: int | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or _STATUS.get(code, 400)
        self.headers = headers or {}  # e.g. Retry-After on a 429

    def __reduce__(self) -> tuple[type[AppError], tuple[str, str, int, dict[str, str]]]:
        # Whole across a process boundary: a refusal raised by work in a worker process (server/offload.py).
        return type(self), (self.code, self.message, self.status, self.headers)

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


MAX_DEPTH = 64  # nesting of JSON from clients; deeper is `invalid` (nothing we take needs more)


def json_problem(value: object, limit: int = MAX_DEPTH, *, strings: bool = True) -> str | None:
    """What makes parsed JSON from a client unusable, said to finish "the body …", or None: nesting deeper
    than `limit` (walked without recursion), or a lone UTF-16 surrogate (`"\\ud800"` parses, but is not
    Unicode and could never be stored). `strings=False` skips the strings, for JSON whose text holds no
    `\\ud` escape (`may_hold_surrogates`): the only way one gets in."""
    if isinstance(value, str):
        return _string_problem(value) if strings else None
    if not isinstance(value, (dict, list)):
        return None
    stack: list[tuple[dict[Any, Any] | list[Any], int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return f"is nested more than {limit} levels deep"
        children = item.values() if isinstance(item, dict) else item
        if strings:
            texts = (*item, *children) if isinstance(item, dict) else children  # a dict's keys, then its values
            problem = next((p for c in texts if isinstance(c, str) and (p := _string_problem(c))), None)
            if problem is not None:
                return problem
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return None


def may_hold_surrogates(text: str | bytes) -> bool:
    """Whether JSON text has a `\\ud…` escape, the only way a lone surrogate gets into what it parses to."""
    if isinstance(text, bytes):
        return b"\\ud" in text or b"\\uD" in text
    return "\\ud" in text or "\\uD" in text


def _string_problem(text: str) -> str | None:
    return None if text.isascii() or not _has_surrogate(text) else "holds a lone UTF-16 surrogate: not valid Unicode"


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def json_object(value: object, what: str) -> dict[str, Any]:
    """`value` (JSON text or already parsed) as a JSON object, or an `invalid` error naming `what`."""
    import json

    strings = True
    if isinstance(value, (str, bytes)):
        strings = may_hold_surrogates(value)
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise AppError(vocab.INVALID, f"{what} must be a JSON object") from None
    if not isinstance(value, dict):
        raise AppError(vocab.INVALID, f"{what} must be a JSON object")
    problem = json_problem(value, strings=strings)
    if problem:
        raise AppError(vocab.INVALID, f"{what} {problem}")
    return value
