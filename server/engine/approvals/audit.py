"""The audit trail: who asked, who decided what, what ran and why, when — rendered from events tagged
`audit` as clients may see them (`public`: secret-looking values already hidden)."""
from __future__ import annotations

from typing import Any

from ... import vocab
from ...vocab import Event
from .decisions import request_of


def audit_entry(event: Event) -> dict[str, Any]:
    """One audit line for one (public) event."""
    base = {"seq": event["seq"], "ts": event.get("ts"), "who": event.get("sender"), "agent": event.get("agent"),
            "chat": event.get("chat")}
    kind = event.get("kind")
    if kind == vocab.MESSAGE and event.get("role") == "assistant":
        call = event["tool_calls"][0]
        request = request_of(event)
        return {**base, "action": "approval_requested", "approval_id": call["id"],
                "tool_call_id": request.get("toolCallId"), "tool": request.get("toolName"),
                "arguments": request.get("toolArguments"), "asked_by": request.get("askers") or []}
    if kind == vocab.MESSAGE and event.get("decision"):
        decision = event["decision"]
        extra = {k: decision[k] for k in ("arguments", "original", "changed", "voters", "required", "until")
                 if decision.get(k) is not None}  # an edit keeps both versions; a vote, who approved so far
        action = "approved_partly" if decision.get("final") is False else "decided"
        return {**base, "action": action, "approval_id": event.get("tool_call_id"), "tool": decision.get("tool"),
                "decision": decision.get("decision"), "scope": decision.get("scope"),
                "reason": decision.get("reason"), "match": decision.get("match"),
                **extra, **_policy(decision.get("policy"))}
    if kind == vocab.MESSAGE and event.get("role") == "tool":
        action = ("tool_call_rejected" if event.get("rejected") else "tool_call_denied")
        return {**base, "action": action, "tool_call_id": event.get("tool_call_id"), "tool": event.get("name"),
                "result": event.get("content"), **_policy(event.get("policy"))}
    if kind == vocab.TOOL_STARTED:
        return {**base, "action": "tool_started", "tool_call_id": event.get("call_id"), "tool": event.get("tool"),
                **_policy(event.get("policy"))}
    if kind == vocab.REFUSED:
        return {**base, "action": "refused", "code": event.get("code"), "message": event.get("message"),
                "tool_call_id": event.get("tool_call_id"), "role": event.get("role_of_sender"),
                "count": event.get("count", 1), **({"tool_call_ids": event["tool_call_ids"]}
                                                   if event.get("tool_call_ids") else {})}
    if kind in (vocab.RULE_ADDED, vocab.GRANT_ADDED):
        item = event.get("rule") or event.get("grant") or {}
        return {**base, "action": kind, **{k: v for k, v in item.items() if k != "by"}}
    if kind in (vocab.WEBHOOK_DELIVERED, vocab.WEBHOOK_FAILED, vocab.APPROVAL_ESCALATED):  # server/engine/notify/
        return {**base, "action": kind, **{k: event[k] for k in ("approval_id", "to", "after_minutes", "hook", "target",
                                                                 "source_seq", "subject", "attempts", "status", "error")
                                           if k in event}}
    if kind == vocab.NETWORK_CONNECTION:  # a sandboxed call's connection (server/engine/approvals/network.py)
        return {**base, "action": kind, **{k: event.get(k) for k in ("call_id", "tool", "host", "port", "address",
                                                                     "allowed", "decision", "reason", "sent",
                                                                     "received", "approval_id", "rule_id",
                                                                     "grant_id")}}
    if kind == vocab.FILE_UPLOADED:
        return {**base, "action": kind, "path": event.get("path"), "size": event.get("size"),
                "sha256": event.get("sha256")}
    if kind in (vocab.MCP_SIGNED_IN, vocab.MCP_SIGNED_OUT):  # an OAuth MCP server (server/engine/world/mcp_sign_in.py)
        return {**base, "action": kind, **{k: event[k] for k in ("server", "host", "revoked") if k in event}}
    return {**base, "action": kind, **{k: v for k, v in event.items() if k.endswith("_id")}}


def _policy(policy: Any) -> dict[str, Any]:
    """Why something ran or was refused without a person deciding: the rule, grant or default, and its author."""
    if not isinstance(policy, dict):
        return {}
    return {"allowed_by" if policy.get("verdict") == "allow" else "denied_by": policy.get("reason"),
            **{k: policy[k] for k in ("rule_id", "grant_id") if policy.get(k)}}
