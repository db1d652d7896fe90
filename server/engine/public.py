"""Events as clients receive them: secret-looking values hidden wherever arguments are quoted.

The log keeps the real values (tools run with them, and the LLM sees the calls it wrote); every
event that leaves the server — on the bus, over the WebSocket, from `/events` — goes through
`public` first, so a spectator never reads a token that an agent passed to a tool.
"""
from __future__ import annotations

from typing import Any

import orjson

from .. import vocab
from ..tools.redact import redact
from ..vocab import Event


def public(event: Event) -> Event:
    """`event` with secrets in tool arguments, decision and rule `match` redacted, and an invite's
    token hash left out (a copy if anything changed)."""
    out = event
    if event.get("tool_calls"):
        browser_run = set(event.get("client_calls") or ())  # the browser runs these with what it is sent
        calls = [call if call.get("id") in browser_run else _with_hidden_arguments(call) for call in event["tool_calls"]]
        if calls != event["tool_calls"]:
            out = {**out, "tool_calls": calls}
    if isinstance(event.get("decision"), dict) and event["decision"].get("match"):
        out = {**out, "decision": {**event["decision"], "match": redact(event["decision"]["match"])},
               "content": _hidden_json(event.get("content"))}
    if "token_sha256" in event:  # an invite's: it identifies the token
        out = {k: v for k, v in out.items() if k != "token_sha256"}
    if event.get("kind") == vocab.RULE_ADDED and isinstance(event.get("rule"), dict):
        out = {**out, "rule": {**event["rule"], "match": redact(event["rule"].get("match") or {})}}
    return out


def _with_hidden_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call
    arguments = _hidden_json(function.get("arguments"))
    return call if arguments == function.get("arguments") else {**call, "function": {**function, "arguments": arguments}}


def _hidden_json(text: Any) -> Any:
    """JSON text with its secret-looking values redacted; anything else (or invalid JSON) as it is."""
    if not isinstance(text, str):
        return text
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    hidden = redact(value)
    return text if hidden == value else orjson.dumps(hidden).decode()
