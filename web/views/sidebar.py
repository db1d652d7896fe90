"""What the sidebar and the settings show: agents' live status, agents, rules, grants and their time left,
browser calls, MCP servers' states."""
from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from server import vocab
from server.tools.globs import describe_match

from .text import STATE_LABELS, json_value, who


def status_view(frame: dict[str, Any], streaming: bool = False) -> dict[str, Any]:
    """An agent's live status from a `status` frame (or the board's current one)."""
    state = frame.get("state") or vocab.IDLE
    if state == vocab.WAITING_APPROVAL and frame.get("waiting_for") == "client":
        state = "waiting_client"
    if state == vocab.IDLE and frame.get("last_error"):
        state = vocab.ERROR
    if streaming:
        state = "streaming"
    detail = frame.get("last_error") if state == vocab.ERROR else None
    if frame.get("retry"):
        detail = f"retry {frame['retry']}: {frame.get('last_error') or ''}"
    return {"agent": frame.get("agent") or "", "state": state, "label": STATE_LABELS.get(state, str(state)),
            "detail": detail, "chat": frame.get("chat") if isinstance(frame.get("chat"), str) else None}


def agent_view(agent: dict[str, Any]) -> dict[str, Any]:
    return {"name": agent.get("name") or "", "provider": agent.get("provider") or "", "model": agent.get("model") or "",
            "system_prompt": agent.get("system_prompt") or "", "base_url": agent.get("base_url") or "",
            "tools": ", ".join(agent["tools"]) if isinstance(agent.get("tools"), list) else "",
            "tools_mode": "list" if isinstance(agent.get("tools"), list) else "all"}


def rule_view(rule: dict[str, Any]) -> dict[str, Any]:
    match = rule.get("match") or {}
    return {"id": rule.get("id"), "tool": rule.get("tool"), "effect": rule.get("effect"),
            "match": describe_match(match, allow=rule.get("effect") == "allow"), "by": who(rule.get("by"))}


def grant_view(grant: dict[str, Any]) -> dict[str, Any]:
    return {"id": grant.get("id"), "tool": grant.get("tool"), "effect": grant.get("effect"),
            "chat": grant.get("chat"), "agent": grant.get("agent") or "nobody (an old grant)",
            "by": who(grant.get("by")), "expires": grant.get("expires_at"),
            "left": time_left(grant.get("expires_at"))}


def time_left(end: object, now: datetime | None = None) -> str:
    """"29 min left" until a time-boxed grant's end (static/app.js counts it down on the page)."""
    if not isinstance(end, str):
        return ""
    try:
        seconds = (datetime.fromisoformat(end.replace("Z", "+00:00")) - (now or datetime.now(UTC))).total_seconds()
    except ValueError:
        return ""
    if seconds <= 0:
        return "ended"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} min left" if minutes < 120 else f"{math.ceil(minutes / 60)} h left"


def client_call_view(call_id: str, name: str, arguments: Any, agent: str | None) -> dict[str, Any]:
    return {"id": call_id, "name": name, "agent": agent or "",
            "arguments": json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)}


def client_calls_of(event: vocab.Event) -> list[dict[str, Any]]:
    """The calls of an assistant message that a browser must run (`client_calls`)."""
    client = set(event.get("client_calls") or ())
    out = []
    for call in event.get("tool_calls") or ():
        if call.get("id") in client:
            function = call.get("function") or {}
            arguments = json_value(function.get("arguments"))
            out.append(client_call_view(call["id"], function.get("name") or "", arguments, event.get("agent")))
    return out


def mcp_state_view(status: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """An MCP server's state line: a status of `GET /api/worlds/{w}` (`name` given) or an `mcp_state` frame."""
    reason = status.get("reason") or (status.get("last_error") or {}).get("message")
    return {"name": name or status.get("server") or "", "state": status.get("state") or "stopped", "reason": reason}
