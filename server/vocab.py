"""The shared vocabulary: event kinds, open-item keys, states and error codes that every module imports."""
from __future__ import annotations

import re
import secrets
import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

Event = dict[str, Any]
"""A persisted event: always has `kind`, `world`, `ts`, and (once appended) `seq`."""

class EventKind(StrEnum):
    """What a persisted event is (its `kind`). Each kind is documented in docs/protocol.md."""
    WORLD_CREATED = "world_created"
    WORLD_UPDATED = "world_updated"
    WORLD_DELETED = "world_deleted"
    AGENT_ADDED = "agent_added"
    AGENT_UPDATED = "agent_updated"
    AGENT_REMOVED = "agent_removed"
    CHAT_CREATED = "chat_created"
    CHAT_RENAMED = "chat_renamed"
    CHAT_DELETED = "chat_deleted"  # closed: gone from every list, nothing more is said in it
    MESSAGE = "message"  # an OpenAI Chat Completions message plus metadata (docs/protocol.md §3)
    TOOL_STARTED = "tool_started"  # a server tool's execution was claimed and begun (see started_by)
    RULE_ADDED = "rule_added"  # an always-rule (allow or deny) for the whole world
    RULE_REVOKED = "rule_revoked"
    GRANT_ADDED = "grant_added"  # a session grant: one tool, one agent, one chat
    GRANT_REVOKED = "grant_revoked"
    GRANT_EXPIRED = "grant_expired"  # a time-boxed grant reached its end (written once, by whichever process noticed)
    REFUSED = "refused"  # a member's tool result or decision the server refused (audited)
    NOTICE = "notice"  # something the engine says in a chat (turn limit reached, ...)
    AGENT_ERROR = "agent_error"  # an LLM turn failed for good; the agent went idle
    TURN_RETRIED = "turn_retried"  # a person asked an agent to answer again after a failed or stopped reply
    REPLY_REGENERATED = "reply_regenerated"  # a person asked for a new version of an agent's reply (the old one kept)
    MESSAGE_EDITED = "message_edited"  # a person's new version of their message: it supersedes the old for the agents
    CHAT_BRANCHED = "chat_branched"  # a new chat that starts with (copies of) another's messages up to one of them
    INVITE_CREATED = "invite_created"
    INVITE_REVOKED = "invite_revoked"  # its token and every cookie it gave stop working
    FILE_UPLOADED = "file_uploaded"  # a person put a file into the world's workspace (agents read it as a note)
    NETWORK_CONNECTION = "network_connection"  # a sandboxed call's connection (`ask` mode), let through or refused
    APPROVAL_ESCALATED = "approval_escalated"  # a request unanswered for `escalate_after` minutes (written once)
    WEBHOOK_SENDING = "webhook_sending"  # a process claimed one webhook delivery of one event (it alone sends it)
    WEBHOOK_DELIVERED = "webhook_delivered"  # that delivery's receiver answered 2xx
    WEBHOOK_FAILED = "webhook_failed"  # that delivery was refused, or failed until its retries ran out
    MCP_SIGNED_IN = "mcp_signed_in"  # a person signed an OAuth MCP server in (its tokens are in the vault, never here)
    MCP_SIGNED_OUT = "mcp_signed_out"  # its tokens were deleted (and revoked where the server offers it)


# The kinds by their old names: every module imports these.
WORLD_CREATED: Final = EventKind.WORLD_CREATED
WORLD_UPDATED: Final = EventKind.WORLD_UPDATED
WORLD_DELETED: Final = EventKind.WORLD_DELETED
AGENT_ADDED: Final = EventKind.AGENT_ADDED
AGENT_UPDATED: Final = EventKind.AGENT_UPDATED
AGENT_REMOVED: Final = EventKind.AGENT_REMOVED
CHAT_CREATED: Final = EventKind.CHAT_CREATED
CHAT_RENAMED: Final = EventKind.CHAT_RENAMED
CHAT_DELETED: Final = EventKind.CHAT_DELETED
MESSAGE: Final = EventKind.MESSAGE
TOOL_STARTED: Final = EventKind.TOOL_STARTED
RULE_ADDED: Final = EventKind.RULE_ADDED
RULE_REVOKED: Final = EventKind.RULE_REVOKED
GRANT_ADDED: Final = EventKind.GRANT_ADDED
GRANT_REVOKED: Final = EventKind.GRANT_REVOKED
GRANT_EXPIRED: Final = EventKind.GRANT_EXPIRED
REFUSED: Final = EventKind.REFUSED
NOTICE: Final = EventKind.NOTICE
AGENT_ERROR: Final = EventKind.AGENT_ERROR
TURN_RETRIED: Final = EventKind.TURN_RETRIED
REPLY_REGENERATED: Final = EventKind.REPLY_REGENERATED
MESSAGE_EDITED: Final = EventKind.MESSAGE_EDITED
CHAT_BRANCHED: Final = EventKind.CHAT_BRANCHED
INVITE_CREATED: Final = EventKind.INVITE_CREATED
INVITE_REVOKED: Final = EventKind.INVITE_REVOKED
FILE_UPLOADED: Final = EventKind.FILE_UPLOADED
NETWORK_CONNECTION: Final = EventKind.NETWORK_CONNECTION
APPROVAL_ESCALATED: Final = EventKind.APPROVAL_ESCALATED
WEBHOOK_SENDING: Final = EventKind.WEBHOOK_SENDING
WEBHOOK_DELIVERED: Final = EventKind.WEBHOOK_DELIVERED
WEBHOOK_FAILED: Final = EventKind.WEBHOOK_FAILED
MCP_SIGNED_IN: Final = EventKind.MCP_SIGNED_IN
MCP_SIGNED_OUT: Final = EventKind.MCP_SIGNED_OUT

# Names the LLM may see (OpenAI's rule for function names). `client.*` names are server-only.
LLM_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# A world id as the server makes them (a slug of its name, maybe with a random suffix). It names a
# folder (the world's workspace) and is part of storage keys: nothing else is ever a world id.
WORLD_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
CLIENT_PREFIX: Final = "client."
REQUEST_APPROVAL: Final = "client.requestApproval"

# Decisions (docs/protocol.md §4)
APPROVE: Final = "approve"
DENY: Final = "deny"
SCOPES: Final = ("once", "session", "for", "always")  # "for": a session grant with an end
APPROVAL_OPTIONS: Final = ("deny", "approve_once", "approve_session", "approve_always")

class AgentState(StrEnum):
    """An agent's state in `status` frames."""
    IDLE = "idle"
    THINKING = "thinking"
    WAITING_APPROVAL = "waiting_approval"
    RUNNING_TOOL = "running_tool"
    ERROR = "error"


IDLE, THINKING, WAITING_APPROVAL, RUNNING_TOOL, ERROR = AgentState


class Role(StrEnum):
    """A person's role in a world (docs/protocol.md §2)."""
    OWNER = "owner"
    MEMBER = "member"
    SPECTATOR = "spectator"


OWNER, MEMBER, SPECTATOR = Role
ROLES: Final = tuple(Role)
CAN_SEND: Final = frozenset({Role.OWNER, Role.MEMBER})
CAN_DECIDE: Final = frozenset({Role.OWNER, Role.MEMBER})
CAN_MANAGE: Final = frozenset({Role.OWNER})


class ErrorCode(StrEnum):
    """Stable error codes (docs/protocol.md §5); their HTTP statuses are in server/errors.py."""
    NOT_FOUND = "not_found"
    FORBIDDEN = "forbidden"
    INVALID = "invalid"
    UNKNOWN_TOOL_CALL = "unknown_tool_call"
    ALREADY_DECIDED = "already_decided"
    NOT_CLIENT_CALL = "not_client_call"  # a client answered a call that the server executes
    CONFLICT = "conflict"


NOT_FOUND, FORBIDDEN, INVALID, UNKNOWN_TOOL_CALL, ALREADY_DECIDED, NOT_CLIENT_CALL, CONFLICT = ErrorCode


# Keys of open items in the log: the indexed projections of "what is pending right now".
def world_key() -> str: return "world"
def agent_key(name: str) -> str: return f"agent:{name}"
def chat_key(chat: str) -> str: return f"chat:{chat}"
def turn_key(agent: str, chat: str) -> str: return f"turn:{agent}:{chat}"
def call_key(call_id: str) -> str: return f"call:{call_id}"
def client_call_key(call_id: str) -> str: return f"clientcall:{call_id}"  # answered by a browser
def approval_key(approval_id: str) -> str: return f"approval:{approval_id}"
def running_key(call_id: str) -> str: return f"running:{call_id}"
def rule_key(rule_id: str) -> str: return f"rule:{rule_id}"
def grant_key(chat: str, grant_id: str) -> str: return f"grant:{chat}:{grant_id}"
def quorum_key(approval_id: str) -> str: return f"quorum:{approval_id}"  # open while approvals are collected
def vote_claim(approval_id: str, n: int) -> str: return f"vote:{approval_id}:{n}"  # the n-th approval
def voter_claim(approval_id: str, person: str) -> str: return f"voter:{approval_id}:{person}"
def issued_claim(call_id: str) -> str: return f"issued:{call_id}"
def exec_claim(call_id: str) -> str: return f"exec:{call_id}"
def escalated_claim(approval_id: str) -> str: return f"escalated:{approval_id}"  # escalated once
def webhook_claim(seq: int, hook: str) -> str: return f"webhook:{seq}:{hook}"  # one process sends it
def delivery_key(seq: int, hook: str) -> str: return f"delivery:{seq}:{hook}"  # open while it is under way
def takeover_claim(seq: int, hook: str, dead: str) -> str:  # one process finishes what `dead` left undone
    return f"webhook:{seq}:{hook}:after:{dead}"



# Prefixes that list every open item of a kind (`EventLog.list_open(world, prefix)`).
def turns_of(agent: str) -> str: return f"turn:{agent}:"
ALL_TURNS: Final = "turn:"
ALL_APPROVALS: Final = "approval:"
ALL_QUORUMS: Final = "quorum:"
ALL_CLIENT_CALLS: Final = "clientcall:"
ALL_RULES: Final = "rule:"
ALL_GRANTS: Final = "grant:"
ALL_AGENTS: Final = "agent:"
ALL_CHATS: Final = "chat:"
ALL_DELIVERIES: Final = "delivery:"

# Open items that mean a world has work: a turn owed, a request or vote pending, a call awaiting its
# result (run here or by a browser) or running, a question asked, a webhook delivery under way. A world with
# one is in the log's work index (`EventLog.worlds_with_work`) and hosted by every process; one without is
# hosted on demand.
WORK_PREFIXES: Final = ("turn:", "approval:", "quorum:", "call:", "clientcall:", "running:", "elicitation:",
                        "delivery:")

# Tags: indexed subsets of the log
def memory_tag(chat: str, agent: str) -> str: return f"mem:{chat}:{agent}"
def shared_memory_tag(chat: str) -> str: return f"mem:{chat}:*"  # human messages, seen by every agent
AUDIT_TAG: Final = "audit"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


_APPROVAL_PREFIX: Final = "approval_"
# Model-given call ids that we keep as they are; others are replaced by ours. Never one shaped like
# an approval id: that could take the id of a later approval request.
SAFE_CALL_ID = re.compile(rf"^(?!{_APPROVAL_PREFIX})[A-Za-z0-9_-]{{1,100}}$")


def approval_id_for(call_id: str) -> str:
    """The id of the one `client.requestApproval` call that may ever ask about `call_id`.

    Derived, not random: a second request for the same call cannot be issued (its id is
    claimed), and a decision finds the call it is about without reading the request first.
    """
    return _APPROVAL_PREFIX + call_id


def call_id_of_approval(approval_id: str) -> str | None:
    """The call an approval id asks about, if it has the shape `approval_id_for` gives."""
    return approval_id.removeprefix(_APPROVAL_PREFIX) if approval_id.startswith(_APPROVAL_PREFIX) else None


_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text up to the seconds


def now_iso() -> str:
    """Now, UTC, to the millisecond (`2026-11-22T19:00:00.123Z`). Every event is stamped: the date and
    time are formatted once a second, the milliseconds each time."""
    global _second
    ms = time.time_ns() // 1_000_000
    second, milli = divmod(ms, 1000)
    if second != _second[0]:
        _second = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{_second[1]}.{milli:03d}Z"


def started_by(event: Event) -> str | None:
    """The process (`instance`) that began running a tool call with this event, if it did.

    A `tool_started` event does, and so does an approving decision that started the call in the
    same append (the usual case: one write between "approved" and "running").
    """
    if event.get("kind") == TOOL_STARTED or (event.get("decision") and event.get("instance")):
        instance = event.get("instance")
        return instance if isinstance(instance, str) else None
    return None


def is_client_name(name: str) -> bool:
    return name.startswith(CLIENT_PREFIX)


_HUMAN: Final = "human:"


def sender_of(member: str) -> str:
    """The `sender` of a human's message: `human:<member name>`."""
    return _HUMAN + member


def member_of(sender: object) -> str | None:
    """The member name in a `sender` (`human:<name>`), or None for an agent or the server."""
    return sender.removeprefix(_HUMAN) if isinstance(sender, str) and sender.startswith(_HUMAN) else None


OWNER_PERSON: Final = "owner"  # the `person` of the owner token and its sessions


def invitee_person(invite_id: str) -> str:
    """The `person` of whoever came in with invite `invite_id`: one invite, one person."""
    return f"invite:{invite_id}"


def person_of(event: Event) -> object:
    """Who really sent a person's event (its `person`), or its sender for events stored before `person`."""
    return event.get("person") or event.get("sender")


def trail_tag(call_id: str) -> str:
    """Every event about one tool call: the call, its approval, the decision, the start, the result."""
    return f"trail:{call_id}"


SERVER_SENDER: Final = "server"

# A tool result's `not_run`: the call never ran, and why (the page and clients must not say "ran").
DENIED: Final = "denied"  # by a person, a rule or a grant
TIMED_OUT: Final = "timed_out"  # nobody decided before the approval's deadline
