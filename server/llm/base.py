"""What every provider takes and returns."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..shapes import ToolCallShape

OnText = Callable[[str], Awaitable[None]]
"""Called with each streamed text delta, in order."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it; may be malformed

    def to_openai(self) -> ToolCallShape:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Reply:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    # Call once the reply is handled: the provider then reads what is left of its response (it does anyway,
    # before its next call or a little later), off the way from the reply to what the reply leads to.
    finish: Callable[[], None] | None = field(default=None, compare=False, repr=False)


class LLMError(Exception):
    """A failed LLM call. `transient` errors (5xx, timeouts, cut streams) are worth retrying."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def reply_too_long(limit: int) -> LLMError:
    """The error of a reply whose text and tool-call arguments passed `limit` characters."""
    return LLMError(f"the LLM's reply passed {limit} characters (llm_reply_limit); the rest was not read",
                    transient=False)


class Provider(Protocol):
    async def complete(self, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       on_text: OnText | None = None, first_token_timeout: float | None = None,
                       reply_limit: int | None = None) -> Reply:
        """One chat completion: stream text through `on_text`, return the whole reply; every failure is an
        `LLMError`: also no first text or tool-call fragment within `first_token_timeout` seconds, and a
        reply whose text and tool-call arguments pass `reply_limit` characters (`reply_too_long`), whose
        reading stops there."""
        ...
