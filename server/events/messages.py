"""Messages (docs/protocol.md §3): people's and agents' messages, tool results, the server's requests and
questions, edits, and copies into a branch."""
from __future__ import annotations

import json
from typing import Any, Literal, NotRequired, TypedDict

from .. import vocab
from ..shapes import DecisionRecord, ToolCallShape
from ..vocab import Event
from .shape import as_event

# -- messages (docs/protocol.md §3) ------------------------------------------------------------------------

class Message(TypedDict):
    """A chat message: a person's, an agent's reply, the server's request, a result or a decision."""
    kind: Literal["message"]
    id: str
    chat: str
    agent: str | None  # whose memory it belongs to (None: every agent's of the chat)
    sender: str
    role: Literal["user", "assistant", "tool"]
    content: str | None
    person: NotRequired[str]  # who really sent a person's message (kept on the server: `public`)
    to: NotRequired[list[str]]  # the agents it is for
    tool_calls: NotRequired[list[ToolCallShape]]
    client_calls: NotRequired[list[str]]
    usage: NotRequired[dict[str, Any]]
    input_seq: NotRequired[int]  # an agent's reply: the last seq of the memory it was made from
    answers: NotRequired[list[int]]  # … the messages it answers
    asked_by: NotRequired[list[str]]  # … who said them
    retried_by: NotRequired[list[str]]
    people: NotRequired[list[str]]  # who those really are, or who may not approve a request (`public` hides)
    stopped: NotRequired[str]  # "stopped by …"
    tool_call_id: NotRequired[str]  # a result's or a decision's
    name: NotRequired[str]  # a result's tool
    decision: NotRequired[DecisionRecord | dict[str, Any]]
    approval: NotRequired[dict[str, Any]]  # a `client.requestApproval`'s parsed arguments
    elicitation: NotRequired[dict[str, Any]]  # a `client.elicit`'s parsed arguments
    elicitation_answer: NotRequired[dict[str, Any]]  # its answer, with the reason of a refusal
    edited: NotRequired[dict[str, Any]]  # a result of a call a person edited: {"by", "changed", "arguments"}
    version_of: NotRequired[str]  # a regenerated reply: the id of its first version
    version: NotRequired[int]  # … and which version it is (2, 3, …)
    copy_of: NotRequired[int]  # a message copied into a branched chat: the seq of the original


def human_message(chat: str, sender: str, person: str, content: str, to: list[str]) -> Event:
    return as_event(Message(kind="message", id=vocab.new_id("msg"), chat=chat, agent=None, sender=sender,
                         person=person, role="user", content=content, to=to))


def agent_reply(message_id: str, chat: str, agent: str, content: str | None, *, input_seq: int, to: list[str],
                turn: dict[str, Any], tool_calls: list[ToolCallShape] | None = None,
                client_calls: list[str] | None = None, usage: dict[str, Any] | None = None,
                stopped: str | None = None) -> Event:
    """An agent's reply; `turn` is what its turn records (whom it answers: `TurnPeople.record`)."""
    made = Message(kind="message", id=message_id, chat=chat, agent=agent, sender=agent, role="assistant",
                   content=content, input_seq=input_seq, to=to)
    if tool_calls:
        made["tool_calls"] = tool_calls
    if client_calls:
        made["client_calls"] = client_calls
    if usage:
        made["usage"] = usage
    if stopped is not None:
        made["stopped"] = stopped
    return as_event({**made, **turn})


def tool_result(call_id: str, name: str, chat: str, agent: str, content: str, *, sender: str = vocab.SERVER_SENDER,
                fields: dict[str, Any] | None = None) -> Event:
    """A tool call's `role: "tool"` result; `fields`: what else it says (`policy`, `not_run`, `edited`, …)."""
    made = Message(kind="message", id=vocab.new_id("msg"), chat=chat, agent=agent, sender=sender, role="tool",
                   tool_call_id=call_id, name=name, content=content)
    return as_event({**made, **(fields or {})})


def _client_call(call_id: str, name: str, arguments: dict[str, Any]) -> ToolCallShape:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def approval_request(chat: str, agent: str, approval_id: str, request: dict[str, Any],
                     people: list[str] | None = None) -> Event:
    """The `client.requestApproval` call the server makes in an agent's name (docs/protocol.md §4);
    `people`: who may not approve it, where several must (kept on the server: `public`)."""
    made = Message(kind="message", id=vocab.new_id("msg"), chat=chat, agent=agent, sender=vocab.SERVER_SENDER,
                   role="assistant", content=None,
                   tool_calls=[_client_call(approval_id, vocab.REQUEST_APPROVAL, request)], approval=request)
    if people is not None:
        made["people"] = people
    return as_event(made)


def question(chat: str, agent: str, question_id: str, name: str, request: dict[str, Any]) -> Event:
    """An MCP server's question to a person mid-call (`client.elicit`), in the agent's name."""
    return as_event(Message(kind="message", id=vocab.new_id("msg"), chat=chat, agent=agent, sender=vocab.SERVER_SENDER,
                         role="assistant", content=None, tool_calls=[_client_call(question_id, name, request)],
                         elicitation=request))


def answer(chat: str, agent: str, sender: str, answering: str, content: str, **fields: Any) -> Event:
    """A `role: "tool"` answer to a server request: a decision (`decision=…`) or a question's answer."""
    made = Message(kind="message", id=vocab.new_id("msg"), chat=chat, agent=agent, sender=sender, role="tool",
                   tool_call_id=answering, content=content)
    return as_event({**made, **fields})


class MessageEdited(TypedDict):
    kind: Literal["message_edited"]
    chat: str
    message_id: str  # the message edited (its first version: every edit names the original)
    edit_of: int  # … and its seq
    content: str  # the new version; the original stays in its own event
    to: list[str]  # the agents it is for now: their replies after the original are regenerated
    sender: str
    person: str  # kept on the server (`public`)


class ChatBranched(TypedDict):
    kind: Literal["chat_branched"]
    chat: dict[str, Any]  # {"id", "title"}: opened as `chat_created` opens one
    from_chat: str
    from_seq: int  # the message the branch starts after: the copies are of the messages up to it
    copied: int  # how many messages were copied (they follow this event, in the same write)
    sender: str


def message_edited(original: Event, content: str, to: list[str], sender: str, person: str) -> Event:
    return as_event(MessageEdited(kind="message_edited", chat=str(original["chat"]), message_id=str(original["id"]),
                               edit_of=int(original["seq"]), content=content, to=to, sender=sender, person=person))


def chat_branched(chat: dict[str, Any], from_chat: str, from_seq: int, copied: int, sender: str) -> Event:
    return as_event(ChatBranched(kind="chat_branched", chat=chat, from_chat=from_chat, from_seq=from_seq,
                              copied=copied, sender=sender))


# What a copied message keeps of its original: its place in the conversation (who said what, which calls and
# results), not what tied it to its own chat's turns (the seqs it answered, its tokens: counted once).
_NOT_COPIED = frozenset({"seq", "ts", "world", "id", "chat", "input_seq", "answers", "asked_by", "retried_by",
                         "people", "usage", "version_of", "version", "redacted", "stopped"})


def branch_copy(event: Event, chat: str, content: str | None,
                tool_calls: list[ToolCallShape] | None) -> Event:
    """A message of another chat, copied into branch `chat` (`copy_of`: the original's seq), with its content
    as the agents last saw it (the latest edit) and the tool calls kept (those answered within the copy)."""
    made = {k: v for k, v in event.items() if k not in _NOT_COPIED}
    made.update(id=vocab.new_id("msg"), chat=chat, content=content, copy_of=int(event["seq"]))
    made.pop("tool_calls", None)
    if tool_calls:
        made["tool_calls"] = tool_calls
    return as_event(made)
