"""The events of agents' turns besides messages: files, network connections, notices, failures, retries
and tool starts."""
from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from .. import vocab
from ..vocab import Event
from .shape import as_event

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
    return as_event(FileUploaded(kind="file_uploaded", chat=chat, path=path, size=size, sha256=sha256, sender=sender,
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
    return as_event(NetworkConnection(
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
    return as_event(made)


def agent_error(chat: str, agent: str, message: str, input_seq: int) -> Event:
    return as_event(AgentError(kind="agent_error", chat=chat, agent=agent, message=message, input_seq=input_seq))


def turn_retried(chat: str, agent: str, sender: str, person: str, retry_of: int, retry_of_id: str | None) -> Event:
    return as_event(TurnRetried(kind="turn_retried", chat=chat, agent=agent, sender=sender, person=person,
                             retry_of=retry_of, retry_of_id=retry_of_id))


def reply_regenerated(chat: str, agent: str, sender: str, person: str, reply: Event) -> Event:
    """A new version of `reply` (an agent's message) was asked for: numbered after the reply's own."""
    version = reply.get("version")
    return as_event(ReplyRegenerated(kind="reply_regenerated", chat=chat, agent=agent, sender=sender, person=person,
                                  reply_seq=int(reply["seq"]), reply_id=str(reply["id"]),
                                  version_of=str(reply.get("version_of") or reply["id"]),
                                  version=(version if isinstance(version, int) else 1) + 1))


def tool_started(call_id: str, tool: str, agent: str, chat: str, retry: bool,
                 policy: dict[str, Any] | None = None) -> Event:
    made = ToolStarted(kind="tool_started", call_id=call_id, tool=tool, agent=agent, chat=chat, retry=retry)
    if policy is not None:
        made["policy"] = policy
    return as_event(made)
