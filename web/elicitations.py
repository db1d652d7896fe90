"""An MCP server's question (engine/approvals/elicitations.py) as an item of the approval queue: a form built
from its flat `requestedSchema`, or in URL mode the link to open with its host. The server checks the answer
again; the form only helps."""
from __future__ import annotations

import json
from typing import Any

from server import vocab
from server.events import request_id

from .views import message_pieces


def is_question(event: vocab.Event) -> bool:
    return (event.get("role") == "assistant" and event.get("sender") == vocab.SERVER_SENDER
            and isinstance(event.get("elicitation"), dict))


def is_answer(event: vocab.Event) -> bool:
    return event.get("role") == "tool" and isinstance(event.get("elicitation_answer"), dict)


def _options(field: dict[str, Any]) -> list[dict[str, str]]:
    """(value, label) pairs of an enum field: `enum` (+ `enumNames`), or `oneOf`/`anyOf` consts with titles."""
    if isinstance(field.get("enum"), list):
        given = field.get("enumNames")
        names: list[Any] = given if isinstance(given, list) else []
        return [{"value": str(v), "label": str(names[i]) if i < len(names) else str(v)}
                for i, v in enumerate(field["enum"])]
    for key in ("oneOf", "anyOf"):
        if isinstance(field.get(key), list):
            return [{"value": str(o.get("const")), "label": str(o.get("title") or o.get("const"))}
                    for o in field[key] if isinstance(o, dict)]
    return []


_INPUTS = {"email": "email", "uri": "url", "date": "date", "date-time": "datetime-local"}  # by format


def _field(name: str, field: dict[str, Any], required: bool) -> dict[str, Any]:
    kind = field.get("type")
    options = _options(field.get("items") or {}) if kind == "array" else _options(field)
    widget = ("checkbox" if kind == "boolean" else "multi" if kind == "array" else "select" if options
              else "number" if kind in ("number", "integer") else
              _INPUTS.get(str(field.get("format")), "text"))
    default = field.get("default")
    return {"name": name, "type": kind, "widget": widget, "label": str(field.get("title") or name),
            "description": str(field.get("description") or ""), "required": required, "options": options,
            "default": default, "defaults": default if isinstance(default, list) else [],
            "min": field.get("minimum"), "max": field.get("maximum"),
            "minlength": field.get("minLength"), "maxlength": field.get("maxLength"),
            "step": "1" if kind == "integer" else "any"}


def question_view(event: vocab.Event) -> dict[str, Any]:
    request = event["elicitation"]
    schema = request.get("requestedSchema") or {}
    required = set(schema.get("required") or [])
    properties = schema.get("properties") or {}
    return {"id": request_id(event), "agent": event.get("agent"), "chat": event.get("chat"),
            "tool": request.get("toolName"), "message": message_pieces(request.get("message")),
            "asked": event.get("ts"), "mode": "url" if request.get("mode") == "url" else "form",
            "url": request.get("url") if request.get("mode") == "url" else None, "host": request.get("host"),
            "expires": request.get("expiresAt"),
            "fields": [_field(n, f, n in required) for n, f in properties.items() if isinstance(f, dict)],
            "schema": json.dumps(schema)}
