"""A tool call the engine is handling, and how its result is written."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ... import events, vocab
from ...log import Batched, Close, Op, Tag
from ...vocab import Event
from ..store import Store


@dataclass(frozen=True)
class CallRef:
    """One tool call of an assistant message, with where it belongs."""
    world: str
    agent: str
    chat: str
    id: str
    name: str
    arguments: str  # raw JSON text as the model wrote it (or as a decider edited it: see as_decided)
    location: str = "server"  # "client": a browser runs it and answers
    edited_by: str | None = None  # the sender who changed the arguments before approving
    changed: tuple[str, ...] = ()  # which arguments they changed

    @property
    def open_key(self) -> str:
        """The log key that stays open until this call has its result."""
        return vocab.client_call_key(self.id) if self.location == "client" else vocab.call_key(self.id)

    @classmethod
    def all_in(cls, message: Event) -> list[CallRef]:
        client = set(message.get("client_calls") or ())
        return [cls(message["world"], message["agent"], message["chat"], c["id"], c["function"]["name"],
                    c["function"].get("arguments") or "", "client" if c["id"] in client else "server")
                for c in message.get("tool_calls") or ()]

    @classmethod
    def find(cls, message: Event, call_id: str) -> CallRef | None:
        return next((c for c in cls.all_in(message) if c.id == call_id), None)

    def as_decided(self, decision: Event) -> CallRef:
        """This call as its approving decision let it run: with the decider's arguments, if edited."""
        details = decision.get("decision") or {}
        arguments = details.get("arguments")
        if not isinstance(arguments, dict):
            return self
        return replace(self, arguments=json.dumps(arguments, ensure_ascii=False), edited_by=decision.get("sender"),
                       changed=tuple(details.get("changed") or ()))

    def parsed_arguments(self) -> dict[str, Any]:
        """Best-effort arguments for display (the validated ones come from the tool registry)."""
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError:
            return {"_raw": self.arguments}
        return value if isinstance(value, dict) else {"_raw": self.arguments}


def error_content(message: str, **extra: Any) -> str:
    return json.dumps({"error": message, **extra}, ensure_ascii=False)


def result_item(call: CallRef, content: str, *, sender: str = vocab.SERVER_SENDER, extra_ops: Sequence[Op] = (),
                fields: dict[str, Any] | None = None) -> Batched:
    """The `role: "tool"` result of `call` and the ops that close it (its append fails if it has one)."""
    fields = dict(fields or {})
    if call.edited_by:  # the LLM is told that what ran is not what it wrote (see llm_input.py)
        fields["edited"] = {"by": call.edited_by, "changed": list(call.changed), "arguments": call.parsed_arguments()}
    event = events.tool_result(call.id, call.name, call.chat, call.agent, content, sender=sender, fields=fields)
    ops: list[Op] = [Close(call.open_key), Tag(vocab.memory_tag(call.chat, call.agent)),
                     Tag(vocab.trail_tag(call.id)), *extra_ops]
    return event, ops


async def append_result(store: Store, call: CallRef, content: str, **options: Any) -> Event:
    """Write the result of `call` (see `result_item`); raises `Conflict` if it already has one."""
    return await store.append(call.world, *result_item(call, content, **options))
