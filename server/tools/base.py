"""A tool's description, its approval policy, and how it runs."""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ..vocab import APPROVAL_OPTIONS


class ToolError(Exception):
    """A tool failed in a way the LLM should hear about: becomes `{"error": message}`."""


@dataclass(frozen=True)
class Passage:
    """The world's answer about one connection: `refusal` "" when it may go, else why not (said with
    `status`: 403, or 429 when too many of the call's connections wait for a person); `by` what decided,
    for the record: `{"rule_id": …}`, `{"grant_id": …}` or `{"approval_id": …}`."""
    refusal: str = ""
    by: dict[str, str] = field(default_factory=dict)
    status: int = 403


class Gate(Protocol):
    """The world's say over a sandboxed call's connections (the `ask` network mode: egress/proxy.py)."""

    async def ask(self, ctx: ToolContext, tool: str, host: str, port: int) -> Passage:
        """Whether `tool`'s call may connect to host:port (a rule, a grant, or a person said so), and by what."""

    async def record(self, ctx: ToolContext, tool: str, connection: dict[str, Any]) -> None:
        """Put one connection on the record: host, port, decision (allowed, refused, or cut after it
        opened), reason, what allowed it, bytes sent and received."""


@dataclass(frozen=True)
class ToolContext:
    world: str
    agent: str
    chat: str
    workspace: Path
    call_id: str = ""  # the LLM's id of the call being run (an MCP elicitation's id derives from it)
    network: Gate | None = field(default=None, compare=False)  # asks about its connections (`ask` mode)


Runner = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    name: str  # what the LLM sees: ^[a-zA-Z0-9_-]{1,64}$
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object
    location: Literal["server", "client"] = "server"
    requires_approval: bool = True
    default_scope: str = "once"
    options: tuple[str, ...] = APPROVAL_OPTIONS
    idempotent: bool = False  # may be run again after an interrupted execution
    approvals_required: int = 1  # distinct people who must approve a call (the two-person rule: 2)
    read_only: bool = False
    run: Runner | None = field(default=None, compare=False)  # None for client tools
    # What the call would change (file_write: a diff against the current file), added to its approval
    # request as it is asked, so a decider sees it beside the arguments; None when they say it all.
    diff: Callable[[dict[str, Any], ToolContext], Awaitable[dict[str, Any]]] | None = field(
        default=None, compare=False)
    # A tool that depends on the world's settings gives its variant for them (the shell's network).
    for_settings: Callable[[dict[str, Any]], Tool] | None = field(default=None, compare=False)

    def spec(self) -> dict[str, Any]:
        """The OpenAI `tools` entry."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def info(self) -> dict[str, Any]:
        """What clients see in `GET /api/worlds/{world}`."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters,
                "location": self.location, "requires_approval": self.requires_approval,
                "default_scope": self.default_scope, "read_only": self.read_only}


async def diff_for_approval(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any] | None:
    """`tool.diff` for an approval request; a failure is said in it (`error`), never fails the request."""
    if tool.diff is None:
        return None
    try:
        return await tool.diff(args, ctx)
    except ToolError as exc:
        return {"path": str(args.get("path") or ""), "error": str(exc)}
    except Exception:  # a decider is still asked, told that there is nothing to compare
        logging.getLogger(__name__).exception("diff of %s failed", tool.name)
        return {"path": str(args.get("path") or ""), "error": "the current file could not be compared"}
