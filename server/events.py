"""Every event kind's shape, and the one constructor that makes it (docs/protocol.md §8).

Nothing else builds an event from a dict literal: each constructor fills a `TypedDict` whose `kind` is a
literal, so the type checker holds each kind to its fields where it is made. The log stores and returns
plain dicts (`vocab.Event`): readers use the accessors here for what every reader needs.
"""
from __future__ import annotations

import json
from typing import Any, Literal, NotRequired, TypedDict, cast

from . import vocab
from .shapes import DecisionRecord, ToolCallShape
from .vocab import Event


def _made(event: Any) -> Event:
    """A checked shape as the plain dict the log takes (a TypedDict is one at run time)."""
    return cast(Event, event)


# -- worlds, agents, chats -------------------------------------------------------------------------------

class WorldCreated(TypedDict):
    kind: Literal["world_created"]
    name: str
    settings: dict[str, Any]
    sender: str


class WorldUpdated(TypedDict):
    kind: Literal["world_updated"]
    name: str
    settings: dict[str, Any]
    sender: str


class WorldDeleted(TypedDict):
    kind: Literal["world_deleted"]
    sender: str


class AgentAdded(TypedDict):
    kind: Literal["agent_added", "agent_updated"]
    agent: dict[str, Any]  # the whole config (`public_agent` hides its secrets on the way out)
    sender: str


class AgentRemoved(TypedDict):
    kind: Literal["agent_removed"]
    name: str
    sender: str


class ChatCreated(TypedDict):
    kind: Literal["chat_created"]
    chat: dict[str, Any]  # {"id", "title"}
    sender: str


class ChatRenamed(TypedDict):
    kind: Literal["chat_renamed"]
    chat: dict[str, Any]
    sender: str
    created_seq: int  # the chat keeps its place among chats (listed by creation)


class ChatDeleted(TypedDict):
    kind: Literal["chat_deleted"]
    chat_id: str
    sender: str


def world_created(name: str, settings: dict[str, Any], sender: str) -> Event:
    return _made(WorldCreated(kind="world_created", name=name, settings=settings, sender=sender))


def world_updated(name: str, settings: dict[str, Any], sender: str) -> Event:
    return _made(WorldUpdated(kind="world_updated", name=name, settings=settings, sender=sender))


def world_deleted(sender: str) -> Event:
    return _made(WorldDeleted(kind="world_deleted", sender=sender))


def agent_added(agent: dict[str, Any], sender: str) -> Event:
    return _made(AgentAdded(kind="agent_added", agent=agent, sender=sender))


def agent_updated(agent: dict[str, Any], sender: str) -> Event:
    return _made(AgentAdded(kind="agent_updated", agent=agent, sender=sender))


def agent_removed(name: str, sender: str) -> Event:
    return _made(AgentRemoved(kind="agent_removed", name=name, sender=sender))


def chat_created(chat: dict[str, Any], sender: str) -> Event:
    return _made(ChatCreated(kind="chat_created", chat=chat, sender=sender))


def chat_renamed(chat: dict[str, Any], sender: str, created_seq: int) -> Event:
    return _made(ChatRenamed(kind="chat_renamed", chat=chat, sender=sender, created_seq=created_seq))


def chat_deleted(chat_id: str, sender: str) -> Event:
    return _made(ChatDeleted(kind="chat_deleted", chat_id=chat_id, sender=sender))


# -- invites, rules, grants, refusals ---------------------------------------------------------------------

class InviteCreated(TypedDict):
    kind: Literal["invite_created"]
    invite: dict[str, Any]  # {"id", "role", "name"}
    invite_id: str
    sender: str
    token_sha256: str  # kept on the server (`public`): it identifies the token


class InviteRevoked(TypedDict):
    kind: Literal["invite_revoked"]
    invite_id: str
    sender: str


class RuleAdded(TypedDict):
    kind: Literal["rule_added"]
    rule: dict[str, Any]
    sender: str


class GrantAdded(TypedDict):
    kind: Literal["grant_added"]
    grant: dict[str, Any]
    sender: str


class RuleRevoked(TypedDict):
    kind: Literal["rule_revoked"]
    rule_id: str
    sender: str


class GrantRevoked(TypedDict):
    kind: Literal["grant_revoked"]
    grant_id: str
    sender: str


class GrantExpired(TypedDict):
    kind: Literal["grant_expired"]
    grant_id: str
    expires_at: str
    sender: str


class Refused(TypedDict):
    kind: Literal["refused"]
    sender: str
    role_of_sender: str
    code: str
    message: str
    tool_call_id: object  # what the refused message answered, as sent
    count: NotRequired[int]  # repeats folded into one entry


def invite_created(invite: dict[str, Any], sender: str, token_sha256: str) -> Event:
    return _made(InviteCreated(kind="invite_created", invite=invite, invite_id=str(invite["id"]), sender=sender,
                               token_sha256=token_sha256))


def invite_revoked(invite_id: str, sender: str) -> Event:
    return _made(InviteRevoked(kind="invite_revoked", invite_id=invite_id, sender=sender))


def rule_added(rule: dict[str, Any], sender: str) -> Event:
    return _made(RuleAdded(kind="rule_added", rule=rule, sender=sender))


def grant_added(grant: dict[str, Any], sender: str) -> Event:
    return _made(GrantAdded(kind="grant_added", grant=grant, sender=sender))


def rule_revoked(rule_id: str, sender: str) -> Event:
    return _made(RuleRevoked(kind="rule_revoked", rule_id=rule_id, sender=sender))


def grant_revoked(grant_id: str, sender: str) -> Event:
    return _made(GrantRevoked(kind="grant_revoked", grant_id=grant_id, sender=sender))


def grant_expired(grant_id: str, expires_at: str) -> Event:
    return _made(GrantExpired(kind="grant_expired", grant_id=grant_id, expires_at=expires_at,
                              sender=vocab.SERVER_SENDER))


def refused(sender: str, role: str, code: str, message: str, answering: object) -> Event:
    return _made(Refused(kind="refused", sender=sender, role_of_sender=role, code=code, message=message,
                         tool_call_id=answering))


# -- files -------------------------------------------------------------------------------------------------

class FileUploaded(TypedDict):
    kind: Literal["file_uploaded"]
    chat: str  # where it was said: every agent of that chat reads it as a note
    path: str  # workspace-relative
    size: int
    sha256: str
    sender: str
    person: str  # who really uploaded (kept on the server: `public`)


def file_uploaded(chat: str, path: str, size: int, sha256: str, sender: str, person: str) -> Event:
    return _made(FileUploaded(kind="file_uploaded", chat=chat, path=path, size=size, sha256=sha256, sender=sender,
                              person=person))


class NetworkConnection(TypedDict):
    kind: Literal["network_connection"]
    chat: str
    agent: str
    call_id: str  # the call whose sandbox connected (its proxy: server/tools/egress/proxy.py)
    tool: str
    host: str  # as the connection named it (CONNECT or the URL): a name, or an IP address
    port: int
    address: str | None  # the checked address it went to (None: refused before)
    allowed: bool  # decision == "allowed"
    # "allowed"; "refused" before it opened (an unreadable request: host "" and port 0); "cut" after the
    # world allowed it and it opened (a tunnel whose TLS hello names another host)
    decision: NotRequired[str]
    reason: str  # why refused, or why cut off ("" for a connection that ended by itself)
    sent: int  # bytes from the command to the host
    received: int  # bytes from the host to the command
    approval_id: str | None  # the request a person decided, when one was asked
    rule_id: NotRequired[str | None]  # else the rule that decided it
    grant_id: NotRequired[str | None]  # or the grant
    sender: str


def network_connection(chat: str, agent: str, call_id: str, tool: str, connection: dict[str, Any]) -> Event:
    """`connection` as the proxy records it (server/tools/egress/proxy.py), with what decided it."""
    def named(key: str) -> str | None:
        return str(connection[key]) if connection.get(key) else None

    decision = str(connection.get("decision") or "refused")
    return _made(NetworkConnection(
        kind="network_connection", chat=chat, agent=agent, call_id=call_id, tool=tool,
        host=str(connection["host"]), port=int(connection["port"]), address=connection.get("address"),
        allowed=decision == "allowed", decision=decision, reason=str(connection.get("reason") or ""),
        sent=int(connection.get("sent") or 0), received=int(connection.get("received") or 0),
        approval_id=named("approval_id"), rule_id=named("rule_id"), grant_id=named("grant_id"),
        sender=vocab.SERVER_SENDER))


# -- turns: notices, failures, retries, tool starts --------------------------------------------------------

class Notice(TypedDict):
    kind: Literal["notice"]
    chat: str
    agent: str | None
    text: str
    input_seq: NotRequired[int]  # a turn-limit notice: what the agent had read when its turn ended


class AgentError(TypedDict):
    kind: Literal["agent_error"]
    chat: str
    agent: str
    message: str
    input_seq: int


class TurnRetried(TypedDict):
    kind: Literal["turn_retried"]
    chat: str
    agent: str
    sender: str
    person: str  # who really retried (kept on the server: `public`)
    retry_of: int
    retry_of_id: str | None


class ReplyRegenerated(TypedDict):
    kind: Literal["reply_regenerated"]
    chat: str
    agent: str
    sender: str
    person: str  # who really asked (kept on the server: `public`)
    reply_seq: int  # the reply regenerated: it and what the agent did after it are superseded in its memory
    reply_id: str
    version_of: str  # the id of the reply's first version
    version: int  # the number the new version will have (2 for the first regeneration)


class ToolStarted(TypedDict):
    kind: Literal["tool_started"]
    call_id: str
    tool: str
    agent: str
    chat: str
    retry: bool
    policy: NotRequired[dict[str, Any]]  # what let it run when no person decided (a rule, a grant, a default)


def notice(chat: str, agent: str | None, text: str, input_seq: int | None = None) -> Event:
    made = Notice(kind="notice", chat=chat, agent=agent, text=text)
    if input_seq is not None:
        made["input_seq"] = input_seq
    return _made(made)


def agent_error(chat: str, agent: str, message: str, input_seq: int) -> Event:
    return _made(AgentError(kind="agent_error", chat=chat, agent=agent, message=message, input_seq=input_seq))


def turn_retried(chat: str, agent: str, sender: str, person: str, retry_of: int, retry_of_id: str | None) -> Event:
    return _made(TurnRetried(kind="turn_retried", chat=chat, agent=agent, sender=sender, person=person,
                             retry_of=retry_of, retry_of_id=retry_of_id))


def reply_regenerated(chat: str, agent: str, sender: str, person: str, reply: Event) -> Event:
    """A new version of `reply` (an agent's message) was asked for: numbered after the reply's own."""
    version = reply.get("version")
    return _made(ReplyRegenerated(kind="reply_regenerated", chat=chat, agent=agent, sender=sender, person=person,
                                  reply_seq=int(reply["seq"]), reply_id=str(reply["id"]),
                                  version_of=str(reply.get("version_of") or reply["id"]),
                                  version=(version if isinstance(version, int) else 1) + 1))


def tool_started(call_id: str, tool: str, agent: str, chat: str, retry: bool,
                 policy: dict[str, Any] | None = None) -> Event:
    made = ToolStarted(kind="tool_started", call_id=call_id, tool=tool, agent=agent, chat=chat, retry=retry)
    if policy is not None:
        made["policy"] = policy
    return _made(made)


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
    return _made(Message(kind="message", id=vocab.new_id("msg"), chat=chat, agent=None, sender=sender,
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
    return _made({**made, **turn})


def tool_result(call_id: str, name: str, chat: str, agent: str, content: str, *, sender: str = vocab.SERVER_SENDER,
                fields: dict[str, Any] | None = None) -> Event:
    """A tool call's `role: "tool"` result; `fields`: what else it says (`policy`, `not_run`, `edited`, …)."""
    made = Message(kind="message", id=vocab.new_id("msg"), chat=chat, agent=agent, sender=sender, role="tool",
                   tool_call_id=call_id, name=name, content=content)
    return _made({**made, **(fields or {})})


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
    return _made(made)


def question(chat: str, agent: str, question_id: str, name: str, request: dict[str, Any]) -> Event:
    """An MCP server's question to a person mid-call (`client.elicit`), in the agent's name."""
    return _made(Message(kind="message", id=vocab.new_id("msg"), chat=chat, agent=agent, sender=vocab.SERVER_SENDER,
                         role="assistant", content=None, tool_calls=[_client_call(question_id, name, request)],
                         elicitation=request))


def answer(chat: str, agent: str, sender: str, answering: str, content: str, **fields: Any) -> Event:
    """A `role: "tool"` answer to a server request: a decision (`decision=…`) or a question's answer."""
    made = Message(kind="message", id=vocab.new_id("msg"), chat=chat, agent=agent, sender=sender, role="tool",
                   tool_call_id=answering, content=content)
    return _made({**made, **fields})


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
    return _made(MessageEdited(kind="message_edited", chat=str(original["chat"]), message_id=str(original["id"]),
                               edit_of=int(original["seq"]), content=content, to=to, sender=sender, person=person))


def chat_branched(chat: dict[str, Any], from_chat: str, from_seq: int, copied: int, sender: str) -> Event:
    return _made(ChatBranched(kind="chat_branched", chat=chat, from_chat=from_chat, from_seq=from_seq,
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
    return _made(made)


# -- escalation and webhooks (server/engine/notify/) -------------------------------------------------------

class ApprovalEscalated(TypedDict):
    kind: Literal["approval_escalated"]
    chat: str
    agent: str
    approval_id: str
    to: list[str]  # the owner ("owner") or the members named by `escalate_to`
    after_minutes: float
    sender: str


class WebhookOutcome(TypedDict):
    kind: Literal["webhook_sending", "webhook_delivered", "webhook_failed"]
    hook: str  # `server/webhooks/settings.py` hook_id: no part of its URL
    target: str  # the URL's host, all that is shown of it
    source_seq: int  # the event delivered
    subject: str  # request, decision, timeout or escalation
    instance: str  # the process that sends it
    attempts: NotRequired[int]
    status: NotRequired[int]  # the receiver's last HTTP status
    error: NotRequired[str]
    taken_from: NotRequired[str]  # a `webhook_sending` that took over: the dead process that had the delivery
    sender: str


def approval_escalated(chat: str, agent: str, approval_id: str, to: list[str], after_minutes: float) -> Event:
    return _made(ApprovalEscalated(kind="approval_escalated", chat=chat, agent=agent, approval_id=approval_id,
                                   to=to, after_minutes=after_minutes, sender=vocab.SERVER_SENDER))


def webhook_outcome(kind: Literal["webhook_sending", "webhook_delivered", "webhook_failed"], hook: str, target: str,
                    source_seq: int, subject: str, instance: str, **more: int | str) -> Event:
    made = WebhookOutcome(kind=kind, hook=hook, target=target, source_seq=source_seq, subject=subject,
                          instance=instance, sender=vocab.SERVER_SENDER)
    return _made({**made, **more})


# -- MCP OAuth sign-ins (server/engine/world/mcp_sign_in.py) -----------------------------------------------

class McpSignedIn(TypedDict):
    kind: Literal["mcp_signed_in"]
    server: str  # the MCP server's name in the world's settings
    host: str  # the authorization server's host, as the person saw it: never a token
    sender: str


class McpSignedOut(TypedDict):
    kind: Literal["mcp_signed_out"]
    server: str
    revoked: bool  # the authorization server accepted the revocation (False: it offers none, or refused)
    sender: str


def mcp_signed_in(server: str, host: str, sender: str) -> Event:
    return _made(McpSignedIn(kind="mcp_signed_in", server=server, host=host, sender=sender))


def mcp_signed_out(server: str, revoked: bool, sender: str) -> Event:
    return _made(McpSignedOut(kind="mcp_signed_out", server=server, revoked=revoked, sender=sender))


# -- reading -----------------------------------------------------------------------------------------------

def request_id(event: Event) -> str:
    """The id of the one `client.*` call of a server request (an approval's id, a question's id)."""
    return str(event["tool_calls"][0]["id"])
