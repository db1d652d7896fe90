"""A chat's history as AG-UI messages: the MESSAGES_SNAPSHOT a run starts with (docs/protocol.md §5).

People's messages are `user` messages, agents' are `assistant` messages with their tool calls, and the
calls' results are `tool` messages. `client.*` traffic is left out: approval requests and decisions (the
run announces pending requests as `requestApproval` calls of its own) and calls a browser runs, with
their answers. Every event goes through `public` first, as everything else that leaves the server.
"""
from __future__ import annotations

import json
from typing import Any

from ag_ui.core import AssistantMessage, FunctionCall, Message, ToolCall, ToolMessage, UserMessage

from ... import vocab
from ...engine.engine import Engine
from ...engine.public import public
from ...vocab import Event

HISTORY_LIMIT = 1000  # the newest events of the chat a snapshot is built from


async def chat_events(engine: Engine, world: str, chat: str) -> list[Event]:
    """The chat's newest messages, oldest first: people's (tagged for every agent) and each agent's memory."""
    agents = [a["name"] for a in await engine.worlds.agents(world)]
    tags = [vocab.shared_memory_tag(chat), *(vocab.memory_tag(chat, agent) for agent in agents)]
    events = await engine.tagged(world, tags, limit=HISTORY_LIMIT)
    return [e for e in events if e.get("kind") == vocab.MESSAGE and e.get("chat") == chat]


def snapshot_messages(events: list[Event]) -> list[Message]:
    """`events` (stored messages, in order) as AG-UI messages, redacted; a result without its call is left out."""
    out: list[Message] = []
    calls: set[str] = set()  # the calls the snapshot holds: only their results go with them
    for event in map(public, events):
        role, message_id = event.get("role"), str(event["id"])
        if event.get("approval") or event.get("decision"):
            continue
        if role == "user":
            sender = event.get("sender")
            out.append(UserMessage(id=message_id, content=_text(event.get("content")),
                                   name=vocab.member_of(sender) or (sender if isinstance(sender, str) else None)))
        elif role == "assistant":
            tool_calls = [ToolCall(id=c["id"], function=FunctionCall(name=c["function"]["name"],
                                                                     arguments=c["function"]["arguments"]))
                          for c in event.get("tool_calls") or [] if not vocab.is_client_name(c["function"]["name"])]
            content = event.get("content")
            if content is None and not tool_calls:
                continue
            calls.update(c.id for c in tool_calls)
            out.append(AssistantMessage(id=message_id, content=None if content is None else _text(content),
                                        name=event.get("agent"), tool_calls=tool_calls or None))
        elif role == "tool" and event.get("tool_call_id") in calls:
            out.append(ToolMessage(id=message_id, tool_call_id=event["tool_call_id"],
                                   content=_text(event.get("content"))))
    return out


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "" if content is None else json.dumps(content)
