"""The events of a world's make-up: the world, its agents and chats, invites, rules and grants,
refusals, and its MCP servers' sign-ins."""
from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from .. import vocab
from ..vocab import Event
from .shape import as_event

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
    return as_event(WorldCreated(kind="world_created", name=name, settings=settings, sender=sender))


def world_updated(name: str, settings: dict[str, Any], sender: str) -> Event:
    return as_event(WorldUpdated(kind="world_updated", name=name, settings=settings, sender=sender))


def world_deleted(sender: str) -> Event:
    return as_event(WorldDeleted(kind="world_deleted", sender=sender))


def agent_added(agent: dict[str, Any], sender: str) -> Event:
    return as_event(AgentAdded(kind="agent_added", agent=agent, sender=sender))


def agent_updated(agent: dict[str, Any], sender: str) -> Event:
    return as_event(AgentAdded(kind="agent_updated", agent=agent, sender=sender))


def agent_removed(name: str, sender: str) -> Event:
    return as_event(AgentRemoved(kind="agent_removed", name=name, sender=sender))


def chat_created(chat: dict[str, Any], sender: str) -> Event:
    return as_event(ChatCreated(kind="chat_created", chat=chat, sender=sender))


def chat_renamed(chat: dict[str, Any], sender: str, created_seq: int) -> Event:
    return as_event(ChatRenamed(kind="chat_renamed", chat=chat, sender=sender, created_seq=created_seq))


def chat_deleted(chat_id: str, sender: str) -> Event:
    return as_event(ChatDeleted(kind="chat_deleted", chat_id=chat_id, sender=sender))


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
    return as_event(InviteCreated(kind="invite_created", invite=invite, invite_id=str(invite["id"]), sender=sender,
                               token_sha256=token_sha256))


def invite_revoked(invite_id: str, sender: str) -> Event:
    return as_event(InviteRevoked(kind="invite_revoked", invite_id=invite_id, sender=sender))


def rule_added(rule: dict[str, Any], sender: str) -> Event:
    return as_event(RuleAdded(kind="rule_added", rule=rule, sender=sender))


def grant_added(grant: dict[str, Any], sender: str) -> Event:
    return as_event(GrantAdded(kind="grant_added", grant=grant, sender=sender))


def rule_revoked(rule_id: str, sender: str) -> Event:
    return as_event(RuleRevoked(kind="rule_revoked", rule_id=rule_id, sender=sender))


def grant_revoked(grant_id: str, sender: str) -> Event:
    return as_event(GrantRevoked(kind="grant_revoked", grant_id=grant_id, sender=sender))


def grant_expired(grant_id: str, expires_at: str) -> Event:
    return as_event(GrantExpired(kind="grant_expired", grant_id=grant_id, expires_at=expires_at,
                              sender=vocab.SERVER_SENDER))


def refused(sender: str, role: str, code: str, message: str, answering: object) -> Event:
    return as_event(Refused(kind="refused", sender=sender, role_of_sender=role, code=code, message=message,
                         tool_call_id=answering))


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
    return as_event(McpSignedIn(kind="mcp_signed_in", server=server, host=host, sender=sender))


def mcp_signed_out(server: str, revoked: bool, sender: str) -> Event:
    return as_event(McpSignedOut(kind="mcp_signed_out", server=server, revoked=revoked, sender=sender))
