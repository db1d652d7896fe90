"""What an MCP tool's annotations are worth: the owner's trust in its server and per-tool overrides.

The MCP specification says annotations are untrusted unless they come from a trusted server. So:
- untrusted server (the default): every tool asks, and none is re-run after a crash;
- trusted server: `readOnlyHint: true` runs without asking, `destructiveHint` true or unset asks
  (`false` runs), `idempotentHint: true` (or read-only) is re-run after a crash; a tool claiming
  read-only *and* destructive asks (a contradiction only tightens);
- the owner's per-tool override (`mcp_servers[i].tools[<mcp tool name>]`) wins over both.
Owner rules and grants still come first (`policy.evaluate`): these are only the tool's default.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # annotations only: `import mcp` costs ~2 s of startup, and a world's settings need none of it
    from mcp import types as mcp_types

Approval = Literal["ask", "never"]
APPROVALS: tuple[str, ...] = ("ask", "never")


@dataclass(frozen=True)
class ToolOverride:
    approval: Approval | None = None  # "ask": always asks; "never": runs without asking
    idempotent: bool | None = None  # whether a call interrupted by a crash is re-run

    @classmethod
    def parse(cls, value: object) -> ToolOverride:
        """From the world setting; ValueError says what is wrong."""
        if not isinstance(value, dict) or set(value) - {"approval", "idempotent"}:
            raise ValueError('a tool override is {"approval"?: "ask"|"never", "idempotent"?: true|false}')
        approval, idempotent = value.get("approval"), value.get("idempotent")
        if approval is not None and approval not in APPROVALS:
            raise ValueError('a tool override\'s approval is "ask" or "never"')
        if idempotent is not None and not isinstance(idempotent, bool):
            raise ValueError("a tool override's idempotent is true or false")
        return cls(approval, idempotent)

    def setting(self) -> dict[str, Any]:
        return {k: v for k, v in (("approval", self.approval), ("idempotent", self.idempotent)) if v is not None}


@dataclass(frozen=True)
class ToolPolicy:
    requires_approval: bool
    read_only: bool
    idempotent: bool


def tool_policy(annotations: mcp_types.ToolAnnotations | None, *, trusted: bool,
                override: ToolOverride | None = None) -> ToolPolicy:
    if trusted and annotations is not None:
        read_only = annotations.read_only_hint is True
        destructive = annotations.destructive_hint is not False  # the spec's default is true
        asks = destructive and not (read_only and annotations.destructive_hint is None)
        idempotent = annotations.idempotent_hint is True or (read_only and not asks)
        policy = ToolPolicy(requires_approval=asks, read_only=read_only and not asks, idempotent=idempotent)
    else:  # an untrusted server's word is worth nothing; a trusted one without hints is the spec's default
        policy = ToolPolicy(requires_approval=True, read_only=False, idempotent=False)
    if override is None:
        return policy
    asks = policy.requires_approval if override.approval is None else override.approval == "ask"
    idempotent = policy.idempotent if override.idempotent is None else override.idempotent
    return ToolPolicy(requires_approval=asks, read_only=policy.read_only and not asks, idempotent=idempotent)
