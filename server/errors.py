"""Errors split by audience: `AppError` goes back to a client (HTTP status, WebSocket error frame)."""
from __future__ import annotations

from . import vocab

_STATUS = {
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

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or _STATUS.get(code, 400)

    def to_json(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


def json_object(value: object, what: str) -> dict:
    """`value` (JSON text or already parsed) as a JSON object, or an `invalid` error naming `what`."""
    import json

    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            raise AppError(vocab.INVALID, f"{what} must be a JSON object") from None
    if not isinstance(value, dict):
        raise AppError(vocab.INVALID, f"{what} must be a JSON object")
    return value
