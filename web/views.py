"""What the templates show, derived from events and live frames: plain dicts, one builder per thing."""
from __future__ import annotations

import json
from typing import Any

from server import vocab
from server.tools.redact import redact

from .markdown import render_markdown

FOLD_CHARS = 400  # longer tool arguments and results are folded into a <details>
FOLD_LINES = 8
STATE_LABELS = {vocab.IDLE: "idle", vocab.THINKING: "thinking", "streaming": "streaming",
                vocab.WAITING_APPROVAL: "waiting for approval", vocab.RUNNING_TOOL: "running a tool",
                vocab.ERROR: "error", "waiting_client": "waiting for the page"}
OPTION_KEYS = {"deny": "d", "approve_once": "o", "approve_session": "s", "approve_always": "a"}


def pretty(value: Any) -> str:
    """JSON for people: indented, non-ASCII kept."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def _loads(text: object) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def folded(text: str) -> bool:
    return len(text) > FOLD_CHARS or text.count("\n") >= FOLD_LINES


def _arguments_text(raw: object) -> str:
    """A tool call's arguments, redacted and indented when they are JSON, as written otherwise."""
    parsed = _loads(raw)
    if isinstance(parsed, dict):
        return pretty(redact(parsed))
    return raw if isinstance(raw, str) else ""


def who(sender: object) -> str:
    """The name to show for an event's `sender`."""
    text = sender if isinstance(sender, str) else ""
    return text.removeprefix("human:") or "someone"


def is_approval_request(event: vocab.Event) -> bool:
    calls = event.get("tool_calls") or ()
    return (event.get("kind") == vocab.MESSAGE and event.get("role") == "assistant"
            and event.get("sender") == vocab.SERVER_SENDER and len(calls) == 1
            and calls[0].get("function", {}).get("name") == vocab.REQUEST_APPROVAL)


def approval_view(event: vocab.Event) -> dict[str, Any]:
    """One entry of the approval queue, from its `client.requestApproval` message."""
    call = event["tool_calls"][0]
    request = _loads(call["function"].get("arguments")) or {}
    arguments = request.get("toolArguments")
    options = [o for o in request.get("options") or () if o in OPTION_KEYS]
    first_arg = next(iter(arguments), "") if isinstance(arguments, dict) else ""
    first_value = arguments.get(first_arg) if isinstance(arguments, dict) and first_arg else None
    return {"id": call["id"], "seq": event.get("seq"), "agent": event.get("agent") or "", "chat": event.get("chat"),
            "tool": str(request.get("toolName") or "?"), "tool_call_id": request.get("toolCallId"),
            "arguments": pretty(arguments if arguments is not None else {}),
            "argument_names": list(arguments) if isinstance(arguments, dict) else [],
            "pattern_arg": first_arg, "pattern": first_value if isinstance(first_value, str) else "",
            "message": str(request.get("message") or ""), "expires": request.get("expiresAt"),
            "options": options, "keys": OPTION_KEYS}


def _decision_text(event: vocab.Event) -> str:
    decision = event.get("decision") or {}
    tool = decision.get("tool") or "the tool"
    if decision.get("timeout"):
        return f"The request to run {tool} timed out."
    if decision.get("decision") == vocab.APPROVE:
        scope = {"once": "once", "session": "for this chat", "always": "always"}.get(decision.get("scope"), "")
        match = decision.get("match")
        extra = f" when {', '.join(f'{k} matches {v}' for k, v in match.items())}" if match else ""
        return f"{who(event.get('sender'))} approved {tool} {scope}{extra}."
    reason = decision.get("reason")
    return f"{who(event.get('sender'))} denied {tool}" + (f": {reason}" if reason else ".")


def _call_views(event: vocab.Event) -> list[dict[str, Any]]:
    client = set(event.get("client_calls") or ())
    out = []
    for call in event.get("tool_calls") or ():
        function = call.get("function") or {}
        text = _arguments_text(function.get("arguments"))
        out.append({"id": call.get("id"), "name": function.get("name") or "?", "arguments": text,
                    "fold": folded(text), "client": call.get("id") in client})
    return out


def _result_view(event: vocab.Event) -> dict[str, Any]:
    content = event.get("content")
    parsed = _loads(content)
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(parsed, (dict, list)):
        text = pretty(parsed)
    else:
        text = content if isinstance(content, str) else pretty(content)
    return {"name": event.get("name") or "tool", "call_id": event.get("tool_call_id"), "text": text,
            "fold": folded(text), "error": error if isinstance(error, str) else None,
            "by_page": who(event.get("sender")) if str(event.get("sender", "")).startswith("human:") else None}


def conversation_item(event: vocab.Event) -> dict[str, Any] | None:
    """How a persisted event shows in its chat's conversation, or None when it does not."""
    kind = event.get("kind")
    base = {"dom_id": f"m-{event.get('id') or event.get('seq')}", "seq": event.get("seq"), "chat": event.get("chat"),
            "ts": event.get("ts") or "", "agent": event.get("agent"), "sender": who(event.get("sender"))}
    if kind == vocab.NOTICE:
        return {**base, "dom_id": f"e-{event['seq']}", "type": "notice", "text": str(event.get("text") or "")}
    if kind == vocab.AGENT_ERROR:
        return {**base, "dom_id": f"e-{event['seq']}", "type": "error", "text": str(event.get("message") or "")}
    if kind != vocab.MESSAGE:
        return None
    role = event.get("role")
    if role == "user":
        return {**base, "type": "human", "html": render_markdown(str(event.get("content") or ""))}
    if is_approval_request(event):
        return {**base, "type": "approval", "approval": approval_view(event)}
    if role == "assistant":
        content = event.get("content")
        return {**base, "type": "agent", "html": render_markdown(content) if isinstance(content, str) else None,
                "calls": _call_views(event), "to_agents": event.get("sender") != event.get("agent")}
    if role == "tool" and event.get("decision"):
        return {**base, "type": "decision", "text": _decision_text(event),
                "approved": (event.get("decision") or {}).get("decision") == vocab.APPROVE}
    if role == "tool":
        return {**base, "type": "result", "result": _result_view(event)}
    return None


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
            "detail": detail}


def agent_view(agent: dict[str, Any]) -> dict[str, Any]:
    return {"name": agent.get("name") or "", "provider": agent.get("provider") or "", "model": agent.get("model") or "",
            "system_prompt": agent.get("system_prompt") or "", "base_url": agent.get("base_url") or "",
            "tools": ", ".join(agent["tools"]) if isinstance(agent.get("tools"), list) else ""}


def rule_view(rule: dict[str, Any]) -> dict[str, Any]:
    match = rule.get("match") or {}
    return {"id": rule.get("id"), "tool": rule.get("tool"), "effect": rule.get("effect"),
            "match": ", ".join(f"{k} ~ {v}" for k, v in match.items()) or "any arguments", "by": who(rule.get("by"))}


def grant_view(grant: dict[str, Any]) -> dict[str, Any]:
    return {"id": grant.get("id"), "tool": grant.get("tool"), "effect": grant.get("effect"),
            "chat": grant.get("chat"), "by": who(grant.get("by"))}


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
            arguments = _loads(function.get("arguments"))
            out.append(client_call_view(call["id"], function.get("name") or "", arguments, event.get("agent")))
    return out
