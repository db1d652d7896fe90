"""What a webhook sends: the `json` format (the event, redacted, with a summary) or Slack's incoming-webhook
message (blocks with the request and a link to the queue)."""
from __future__ import annotations

import json
from typing import Any

from .. import vocab
from ..vocab import Event

# The subject of an event a webhook may be sent, or None.
TYPES = {"request": "approval.requested", "decision": "approval.decided", "timeout": "approval.timed_out",
         "escalation": "approval.escalated"}


def subject(event: Event) -> str | None:
    kind = event.get("kind")
    if kind == vocab.APPROVAL_ESCALATED:
        return "escalation"
    if kind != vocab.MESSAGE:
        return None
    if event.get("approval") is not None and event.get("sender") == vocab.SERVER_SENDER:
        return "request"
    decision = event.get("decision")
    if isinstance(decision, dict) and decision.get("final") is not False:  # a vote is not the decision
        return "timeout" if decision.get("timeout") else "decision"
    return None


def summary(world: str, event: Event, what: str, link: str | None) -> dict[str, Any]:
    """The `json` body: `type`, the world, the approval in brief, the queue's link and the (public) event."""
    calls = event.get("tool_calls") or [{}]
    approval: dict[str, Any] = {"id": event.get("tool_call_id") or event.get("approval_id") or calls[0].get("id"),
                                "agent": event.get("agent"), "chat": event.get("chat")}
    request = event.get("approval")
    if isinstance(request, dict):
        approval |= {"tool": request.get("toolName"), "arguments": request.get("toolArguments"),
                     "message": request.get("message"), "expiresAt": request.get("expiresAt")}
    decision = event.get("decision")
    if isinstance(decision, dict):
        approval |= {"tool": decision.get("tool"), "decision": decision.get("decision"),
                     "reason": decision.get("reason"), "by": event.get("sender")}
    if what == "escalation":
        approval |= {"to": event.get("to"), "after_minutes": event.get("after_minutes")}
    return {"type": TYPES[what], "world": world, "seq": event.get("seq"), "ts": event.get("ts"),
            "approval": approval, "url": link, "event": event}


def slack(world: str, body: dict[str, Any]) -> dict[str, Any]:
    """Slack's incoming-webhook message: `text` (the notification) and blocks, with a button to the queue."""
    approval = body["approval"]
    agent, tool = approval.get("agent") or "an agent", approval.get("tool") or "a tool"
    verb = "approved" if approval.get("decision") == vocab.APPROVE else "denied"
    headline = {"approval.requested": f"{agent} asks to run {tool}",
                "approval.decided": f"{approval.get('by')} {verb} {agent}'s {tool}",
                "approval.timed_out": f"{agent}'s request to run {tool} timed out",
                "approval.escalated": f"{agent}'s request to run {tool} is waiting: escalated"}[body["type"]]
    text = f"*{_escape(headline)}* in world `{_escape(world)}`"
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    if approval.get("message"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _escape(str(approval["message"]))[:2900]}})
    if approval.get("arguments") is not None:
        arguments = json.dumps(approval["arguments"], ensure_ascii=False, indent=1)[:2800]
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"```{_escape(arguments)}```"}})
    if body.get("url"):
        blocks.append({"type": "actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": "Open the queue"}, "url": body["url"]}]})
    return {"text": f"{headline} in {world}", "blocks": blocks}


def _escape(text: str) -> str:
    """Slack's three control characters in mrkdwn."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
