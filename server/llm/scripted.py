"""An offline, deterministic provider driven by a script, and the script of the demo world."""
from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import LLMError, OnText, Reply, ToolCall, reply_too_long


@dataclass(frozen=True)
class Say:
    """Text the scripted agent streams."""

    text: str


@dataclass(frozen=True)
class Call:
    """A tool call the scripted agent makes; `id=None` gets a deterministic `call_s<len>_<i>`."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


Step = str | Say | Call | Sequence[str | Say | Call]
"""What a script returns: a Say (or plain str), a Call, or a list mixing them (texts are joined)."""

Script = Callable[[list[dict[str, Any]]], Step]
"""Takes the transcript exactly as the provider received it and says what to answer."""


class ScriptedProvider:
    """A `Provider` that answers from `script(messages)`, streaming text `chunk_words` words at a time."""

    def __init__(self, script: Script, *, delay: float = 0.0, chunk_words: int = 1) -> None:
        self.script = script
        self.delay = delay
        self.chunk_words = max(1, chunk_words)

    async def complete(self, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       on_text: OnText | None = None, first_token_timeout: float | None = None,
                       reply_limit: int | None = None) -> Reply:
        try:
            step = self.script(messages)
        except Exception as exc:  # a broken script is a failed LLM call, not a crash of the engine
            raise LLMError(f"scripted provider failed: {exc!r}", transient=False) from exc
        items: Sequence[str | Say | Call] = [step] if isinstance(step, (str, Say, Call)) else step
        text = "".join(i.text if isinstance(i, Say) else i for i in items if isinstance(i, (str, Say)))
        calls = [i for i in items if isinstance(i, Call)]
        tool_calls = [ToolCall(id=c.id or f"call_s{len(messages)}_{i}", name=c.name,
                               arguments=json.dumps(c.arguments)) for i, c in enumerate(calls)]
        if reply_limit is not None and len(text) + sum(len(c.arguments) for c in tool_calls) > reply_limit:
            raise reply_too_long(reply_limit)
        chunks = _chunks(text, self.chunk_words)
        for n, chunk in enumerate(chunks):
            if n and self.delay:
                await asyncio.sleep(self.delay)
            if on_text is not None:
                await on_text(chunk)
        prompt_tokens = len(json.dumps(messages)) // 4  # a rough, deterministic stand-in for real counts
        completion_tokens = len(chunks) + len(tool_calls)
        return Reply(content=text or None, tool_calls=tool_calls, finish_reason="tool_calls" if calls else "stop",
                     usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens})


def _chunks(text: str, words: int) -> list[str]:
    """Split into pieces of `words` words each, keeping every character so the pieces join back to `text`."""
    tokens = re.findall(r"\s*\S+\s*|\s+", text)
    return ["".join(tokens[i:i + words]) for i in range(0, len(tokens), words)]


# The demo world -----------------------------------------------------------------------------------------------

DEMO_AGENTS = ("alice", "bob")


def demo_script(agent_name: str) -> Script:
    """The script of `agent_name` in the offline demo world (alice and bob; anyone else just chats)."""
    others = set(DEMO_AGENTS) - {agent_name}

    def script(messages: list[dict[str, Any]]) -> Step:
        turn = _current_turn(messages)
        if turn.trigger is None:
            return Say(f"Hi, I'm {agent_name}. Nobody has asked me anything yet.")
        from_agent = turn.trigger.get("name") in others
        if agent_name == "alice" and not from_agent:
            return _alice(turn)
        if agent_name == "bob":
            return _bob(turn)
        return _chat(agent_name, turn.trigger)

    return script


@dataclass
class _Turn:
    """What happened since the last user message: the calls this agent made and their results."""

    trigger: dict[str, Any] | None
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool name -> the latest such call
    results: dict[str, str] = field(default_factory=dict)  # tool_call_id -> result content


def _current_turn(messages: list[dict[str, Any]]) -> _Turn:
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if start is None:
        return _Turn(trigger=None)
    turn = _Turn(trigger=messages[start])
    for message in messages[start + 1:]:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                turn.calls[call["function"]["name"]] = call
        elif message.get("role") == "tool":
            turn.results[message.get("tool_call_id", "")] = _content_text(message.get("content"))
    return turn


def _result(turn: _Turn, tool: str) -> tuple[bool, str | None]:
    """(called, result) for `tool` in this turn; result is None while it has no answer."""
    call = turn.calls.get(tool)
    return (call is not None, None if call is None else turn.results.get(call["id"]))


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _error_of(result: str) -> str | None:
    """The message of an `{"error": ...}` tool result (a denial, a timeout or a failure), else None."""
    try:
        data = json.loads(result)
    except ValueError:
        return None
    if isinstance(data, dict) and "error" in data:
        return str(data["error"]) or "unknown error"
    return None


def _exit_code_of(result: str) -> int | None:
    """`exit_code` of a shell_exec result (`{"exit_code", "output", ...}`), if it has one."""
    try:
        data = json.loads(result)
    except ValueError:
        return None
    code = data.get("exit_code") if isinstance(data, dict) else None
    return code if isinstance(code, int) else None


def _output_of(result: str) -> str:
    """The text output of a tool result, whether plain text or JSON with `stdout`/`output`/`content`."""
    try:
        data = json.loads(result)
    except ValueError:
        return result
    if isinstance(data, dict):
        for key in ("stdout", "output", "content"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return result if isinstance(data, (dict, list)) else str(data)


def _alice(turn: _Turn) -> Step:
    """A human asked: list the workspace (needs approval), summarise, then hand over to bob."""
    called, result = _result(turn, "shell_exec")
    if not called:
        return [Say("Let me look at the workspace first."), Call("shell_exec", {"command": "ls -la"})]
    if result is None:
        return Say("I'm still waiting for the listing.")
    ask_bob = "@bob could you read notes.md and tell us what it says?"
    error = _error_of(result)
    if error is not None:
        return Say(f"I couldn't list the workspace ({error}). No problem, we can do without it.\n\n{ask_bob}")
    exit_code = _exit_code_of(result)
    if exit_code:
        return Say(f"`ls -la` failed with exit code {exit_code}. Odd, but let's carry on.\n\n{ask_bob}")
    names = [line.split()[-1] for line in _output_of(result).splitlines()
             if line.strip() and not line.startswith("total") and line.split()[-1] not in (".", "..")]
    listing = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "") if names else "nothing yet"
    count = f"{len(names)} entry" if len(names) == 1 else f"{len(names)} entries"
    return Say(f"The workspace has {count}: {listing}.\n\n{ask_bob}")


def _bob(turn: _Turn) -> Step:
    """Addressed: read notes.md (no approval), notify the browser, then answer without mentioning anyone."""
    read, notes = _result(turn, "file_read")
    if not read:
        return [Say("Sure, reading notes.md."), Call("file_read", {"path": "notes.md"})]
    if notes is None:
        return Say("I'm still waiting for notes.md.")
    error = _error_of(notes)
    notified, _ = _result(turn, "ui_notify")
    if not notified:
        count = len(_output_of(notes).splitlines())
        message = "bob could not read notes.md" if error else f"bob read notes.md ({count} lines)"
        return Call("ui_notify", {"message": message})
    if error is not None:
        return Say(f"I couldn't read notes.md: {error}. Maybe it hasn't been written yet.")
    lines = [line for line in _output_of(notes).splitlines() if line.strip()]
    first = lines[0].strip().lstrip("#").strip() if lines else ""
    # Strip '@' so quoting the notes never wakes another agent by accident.
    summary = f' It starts with "{first.replace("@", "")}".' if first else " It is empty."
    return Say(f"I read notes.md: {len(lines)} non-empty lines.{summary} That's all from me.")


def _chat(agent_name: str, trigger: dict[str, Any]) -> Step:
    """A friendly reply that never mentions anyone (so a conversation between agents ends here)."""
    sender = str(trigger.get("name") or "there").replace("@", "")
    words = len(_content_text(trigger.get("content")).split())
    return Say(f"Hello {sender}! I'm {agent_name}, a scripted demo agent running offline. "
               f"I got your message ({words} words) but I only know a few tricks.")
