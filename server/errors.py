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


def too_deep(value: object, limit: int = MAX_DEPTH) -> bool:
    """Whether parsed JSON nests arrays/objects deeper than `limit` (iterative: no recursion to overflow)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
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
    if too_deep(value):
        raise AppError(vocab.INVALID, f"{what} is nested more than {MAX_DEPTH} levels deep")
    return value
