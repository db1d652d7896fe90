"""The audit trail: who asked, who decided what, when — rendered from events tagged `audit`."""
from __future__ import annotations

from typing import Any

from .. import vocab
from ..tools.redact import redact
from .approvals import request_of
from ..vocab import Event


def audit_entry(event: Event) -> dict[str, Any]:
    """One audit line for one event; arguments are shown redacted."""
    base = {"seq": event["seq"], "ts": event.get("ts"), "who": event.get("sender"), "agent": event.get("agent"),
            "chat": event.get("chat")}
    kind = event.get("kind")
    if kind == vocab.MESSAGE and event.get("role") == "assistant":
        call = event["tool_calls"][0]
        request = request_of(event)
        return {**base, "action": "approval_requested", "approval_id": call["id"],
                "tool_call_id": request.get("toolCallId"), "tool": request.get("toolName"),
                "arguments": request.get("toolArguments")}
    if kind == vocab.MESSAGE and event.get("decision"):
        decision = event["decision"]
        return {**base, "action": "decided", "approval_id": event.get("tool_call_id"), "tool": decision.get("tool"),
                "decision": decision.get("decision"), "scope": decision.get("scope"),
                "reason": decision.get("reason"), "match": redact(decision.get("match"))}
    if kind == vocab.MESSAGE and event.get("role") == "tool":
        return {**base, "action": "tool_call_rejected" if event.get("rejected") else "tool_call_denied",
                "tool_call_id": event.get("tool_call_id"), "tool": event.get("name"),
                "result": event.get("content")}
    if kind == vocab.REFUSED:
        return {**base, "action": "refused", "code": event.get("code"), "message": event.get("message"),
                "tool_call_id": event.get("tool_call_id"), "role": event.get("role_of_sender")}
    if kind in (vocab.RULE_ADDED, vocab.GRANT_ADDED):
        item = event.get("rule") or event.get("grant") or {}
        return {**base, "action": kind, **redact({k: v for k, v in item.items() if k != "by"})}
    return {**base, "action": kind, **{k: v for k, v in event.items() if k.endswith("_id")}}
