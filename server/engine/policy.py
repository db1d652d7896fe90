"""Whether a tool call may run now, must be denied, or needs a human.

Order (first match wins): deny rules, then always-rules (with optional argument globs),
then session grants of this chat, then the tool's own default.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..tools.base import Tool
from ..tools.redact import args_match
from ..vocab import Event

Verdict = Literal["allow", "deny", "ask"]


@dataclass(frozen=True)
class PolicyResult:
    verdict: Verdict
    reason: str
    rule_id: str | None = None


def _rule_applies(rule: dict[str, Any], tool: str, args: dict[str, Any]) -> bool:
    return rule.get("tool") == tool and args_match(rule.get("match") or {}, args)


def evaluate(tool: Tool, args: dict[str, Any], *, rules: list[Event], grants: list[Event]) -> PolicyResult:
    """`rules` are the open `rule_added` events of the world, `grants` the open `grant_added` of this chat."""
    for effect in ("deny", "allow"):
        for event in rules:
            rule = event["rule"]
            if rule.get("effect") == effect and _rule_applies(rule, tool.name, args):
                return PolicyResult("deny" if effect == "deny" else "allow",
                                    f"{effect} rule {rule['id']}", rule["id"])
    for event in grants:
        grant = event["grant"]
        if grant.get("tool") == tool.name:
            return PolicyResult("allow", f"session grant {grant['id']}", grant["id"])
    if tool.location == "client" or not tool.requires_approval:
        return PolicyResult("allow", "no approval required")
    return PolicyResult("ask", "approval required")
