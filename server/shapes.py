"""The shapes of the dicts that travel through the log and the LLM calls, for the type checker and the reader.

Events themselves stay `vocab.Event` (a plain dict: each kind has its own fields, and old logs have fewer).
"""
from __future__ import annotations

from typing import Any, Literal, TypedDict


class ToolFunction(TypedDict):
    name: str
    arguments: str  # raw JSON text as the model wrote it; may be malformed


class ToolCallShape(TypedDict):
    """One tool call of an assistant message, as the OpenAI API and the log hold it."""
    id: str
    type: Literal["function"]
    function: ToolFunction


class DecisionRecord(TypedDict, total=False):
    """The `decision` field of a person's (or the server's) decision on an approval request."""
    decision: str  # vocab.APPROVE | vocab.DENY
    scope: str  # once | session | for | always
    until: str  # scope `for`: when its grant ends
    reason: str | None
    match: dict[str, str] | None
    tool: str
    timeout: bool
    policy: dict[str, Any]  # the rule that made the server decide, when it did
    arguments: dict[str, Any]  # what ran, when a decider edited the call
    changed: list[str]
    voters: list[str]  # several approvals required: who approved so far
    may_decide: list[str]  # and who may still approve, by name
    required: int
    final: bool


class MessageShape(TypedDict, total=False):
    """A chat message event (kind `message`): a person's, an agent's reply, or a tool's result."""
    kind: str
    id: str
    seq: int
    chat: str
    agent: str | None
    sender: str
    role: Literal["user", "assistant", "tool"]
    content: str | None
    to: list[str]  # the agents it is for (owe it a reply)
    input_seq: int  # an agent's reply: the last seq of the memory it was made from
    answers: list[int]  # an agent's reply: the messages it answers (said to it, unanswered), by seq
    asked_by: list[str]  # an agent's reply: who said them (for another agent's message: whom it answered)
    tool_calls: list[ToolCallShape]
    client_calls: list[str]
    tool_call_id: str
    decision: DecisionRecord
    usage: dict[str, Any]  # token counts as the provider reported them
