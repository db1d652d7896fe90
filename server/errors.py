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

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


MAX_DEPTH = 64  # nesting of JSON from clients; deeper is `invalid` (nothing we take needs more)


def json_problem(value: object, limit: int = MAX_DEPTH) -> str | None:
    """What makes parsed JSON from a client unusable, said to finish "the body …", or None: nesting deeper
    than `limit` (walked without recursion), or a lone UTF-16 surrogate (`"\\ud800"` parses, but is not
    Unicode and could never be stored)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _has_surrogate(item):
                return "holds a lone UTF-16 surrogate: not valid Unicode"
            continue
        if isinstance(item, dict):
            children: list[object] = [*item.keys(), *item.values()]
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return f"is nested more than {limit} levels deep"
        stack.extend((child, depth + 1) for child in children)
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def json_object(value: object, what: str) -> dict[str, Any]:
    """`value` (JSON text or already parsed) as a JSON object, or an `invalid` error naming `what`."""
    import json

    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise AppError(vocab.INVALID, f"{what} must be a JSON object") from None
    if not isinstance(value, dict):
        raise AppError(vocab.INVALID, f"{what} must be a JSON object")
    problem = json_problem(value)
    if problem:
        raise AppError(vocab.INVALID, f"{what} {problem}")
    return value
