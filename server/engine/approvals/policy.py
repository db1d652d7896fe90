"""Whether a tool call may run now, must be denied, or needs a human.

Order (first match wins): deny rules of the world, deny grants of this chat for this agent, allow
rules, allow grants, then the tool's own default. A denial always beats an allowance, whatever its
scope: "deny for this chat" and "deny always" never let a call run.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ... import vocab
from ...tools.base import Tool
from ...tools.globs import args_covered, args_match, describe_match
from ...vocab import Event

Verdict = Literal["allow", "deny", "ask"]


@dataclass(frozen=True)
class PolicyResult:
    verdict: Verdict
    reason: str  # for people and the LLM: "allowed by rule `command ~ echo *` of owner"
    source: dict[str, Any] = field(default_factory=dict)  # the rule or grant that decided, for the record

    def record(self) -> dict[str, Any]:
        """What the log keeps about why a call ran or was refused without asking anyone."""
        return {"verdict": self.verdict, "reason": self.reason, **self.source}


def _by(item: dict[str, Any]) -> str:
    return vocab.member_of(item.get("by")) or str(item.get("by") or "someone")


def rule_result(rule: dict[str, Any]) -> PolicyResult:
    effect = rule.get("effect")
    match = describe_match(rule.get("match"), allow=effect == "allow")
    verb = "denied" if effect == "deny" else "allowed"
    reason = f"{verb} by rule `{match}` of {_by(rule)}"
    if effect == "deny" and rule.get("reason"):
        reason += f": {rule['reason']}"
    return PolicyResult("deny" if effect == "deny" else "allow", reason,
                        {"rule_id": rule["id"], "by": rule.get("by"), "match": rule.get("match") or {}})


def grant_result(grant: dict[str, Any]) -> PolicyResult:
    effect = grant.get("effect")
    verb = "denied" if effect == "deny" else "allowed"
    until = f" until {grant['expires_at']}" if grant.get("expires_at") else ""
    reason = f"{verb} for {grant.get('agent') or 'this agent'} in this chat{until} by {_by(grant)}"
    if effect == "deny" and grant.get("reason"):
        reason += f": {grant['reason']}"
    return PolicyResult("deny" if effect == "deny" else "allow", reason,
                        {"grant_id": grant["id"], "by": grant.get("by")})


def rule_applies(rule: dict[str, Any], tool: str, args: dict[str, Any]) -> bool:
    """Whether an allow rule allows this call: its globs match narrowly (server/tools/globs.py)."""
    return rule.get("tool") == tool and args_match(rule.get("match") or {}, args)


def rule_covers(rule: dict[str, Any], tool: str, args: dict[str, Any]) -> bool | None:
    """Whether a deny or ask rule covers this call: widely, and None when a value hides what it runs."""
    return False if rule.get("tool") != tool else args_covered(rule.get("match") or {}, args)


def grant_in_force(grant: dict[str, Any], now: datetime | None = None) -> bool:
    """Whether a grant holds now: a time-boxed one (`expires_at`) only before its end."""
    end = grant.get("expires_at")
    if not isinstance(end, str):
        return True
    try:
        return (now or datetime.now(UTC)) < datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return False  # an end nobody can read holds no longer


def grant_applies(grant: dict[str, Any], tool: str, agent: str, chat: str, args: dict[str, Any]) -> bool:
    """A session grant covers one tool, for one agent, in one chat (grants without an agent cover nobody),
    until its end if it has one; a network grant, only the host:port it was given for (its `match`)."""
    return grant.get("tool") == tool and grant.get("agent") == agent and grant.get("chat") == chat \
        and grant_in_force(grant) and args_match(grant.get("match") or {}, args)


def evaluate(tool: Tool, args: dict[str, Any], *, agent: str, chat: str, rules: list[Event],
             grants: list[Event]) -> PolicyResult:
    """`rules` are the open `rule_added` events of the world, `grants` its open `grant_added` events.

    Denials first (rules, then this agent's grants in this chat); then `ask` rules, which send a call
    to people however many allowances cover it, and may ask for several distinct approvals (the
    two-person rule; a tool may require them too); then allowances (rules, then grants); then the
    tool's default. Deny and ask rules match widely, allow rules narrowly; a call whose arguments hide
    what they run from a deny or ask rule goes to people (it is never allowed by a rule or default).
    """
    unsure: list[dict[str, Any]] = []  # deny or ask rules that might cover the call
    for event in rules:
        rule = event["rule"]
        if rule.get("effect") == "deny":
            covered = rule_covers(rule, tool.name, args)
            if covered:
                return rule_result(rule)
            if covered is None:
                unsure.append(rule)
    for event in grants:
        if event["grant"].get("effect") == "deny" and grant_applies(event["grant"], tool.name, agent, chat, args):
            return grant_result(event["grant"])
    asking = [e["rule"] for e in rules if e["rule"].get("effect") == "ask"
              and rule_covers(e["rule"], tool.name, args) is not False] + unsure
    required = max([tool.approvals_required, *(int(r.get("approvals_required") or 1) for r in asking)])
    if asking or required > 1:
        strictest = max(asking, key=lambda r: int(r.get("approvals_required") or 1), default=None)
        source: dict[str, Any] = {"approvals_required": required}
        if strictest is not None:
            source |= {"rule_id": strictest["id"], "by": strictest.get("by")}
        people = f"{required} people's approvals" if required > 1 else "a person's approval"
        why = " (a rule may cover it: its arguments hide what they run)" if unsure else ""
        return PolicyResult("ask", f"needs {people}{why}", source)
    for event in rules:
        if event["rule"].get("effect") == "allow" and rule_applies(event["rule"], tool.name, args):
            return rule_result(event["rule"])
    for event in grants:
        if event["grant"].get("effect") == "allow" and grant_applies(event["grant"], tool.name, agent, chat, args):
            return grant_result(event["grant"])
    if tool.location == "client" or not tool.requires_approval:
        return PolicyResult("allow", "needs no approval", {"default": True})
    return PolicyResult("ask", "approval required")


def file_access(tool: Tool | None, path: object, *, rules: list[Event], agent: str = "", chat: str = "",
                grants: list[Event] | None = None) -> PolicyResult:
    """The verdict a call of `tool` (file_read, file_write) on `path` alone would get: `allow` where no
    person is needed. The diff an approval request shows asks it as the request's agent; the files panel
    as nobody (no agent: no session grant applies, only the world's rules and the tool's default).
    Without the tool (an agent not given it), only a person could: `ask`."""
    if tool is None:
        return PolicyResult("ask", "the tool is not available: only a person could")
    return evaluate(tool, {"path": path}, agent=agent, chat=chat, rules=rules, grants=grants or [])
