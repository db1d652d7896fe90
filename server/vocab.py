"""The shared vocabulary: event kinds, open-item keys, states and error codes that every module imports."""
from __future__ import annotations

import re
import secrets
from datetime import datetime, timezone
from typing import Any, Final

Event = dict[str, Any]
"""A persisted event: always has `kind`, `world`, `ts`, and (once appended) `seq`."""

# Event kinds -----------------------------------------------------------------
WORLD_CREATED: Final = "world_created"
WORLD_UPDATED: Final = "world_updated"
WORLD_DELETED: Final = "world_deleted"
AGENT_ADDED: Final = "agent_added"
AGENT_UPDATED: Final = "agent_updated"
AGENT_REMOVED: Final = "agent_removed"
CHAT_CREATED: Final = "chat_created"
MESSAGE: Final = "message"  # an OpenAI Chat Completions message plus metadata (PROTOCOL §3)
TOOL_STARTED: Final = "tool_started"  # a server tool's execution was claimed and begun (see started_by)
RULE_ADDED: Final = "rule_added"  # an always-rule (allow or deny) for the whole world
RULE_REVOKED: Final = "rule_revoked"
GRANT_ADDED: Final = "grant_added"  # a session grant: one tool, one chat
GRANT_REVOKED: Final = "grant_revoked"
REFUSED: Final = "refused"  # a tool result or decision the server refused (audited)
NOTICE: Final = "notice"  # something the engine says in a chat (turn limit reached, ...)
AGENT_ERROR: Final = "agent_error"  # an LLM turn failed for good; the agent went idle
INVITE_CREATED: Final = "invite_created"
INVITE_REVOKED: Final = "invite_revoked"  # its token and every cookie it gave stop working

# Names the LLM may see (OpenAI's rule for function names). `client.*` names are server-only.
LLM_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
CLIENT_PREFIX: Final = "client."
REQUEST_APPROVAL: Final = "client.requestApproval"

# Decisions (PROTOCOL §4)
APPROVE: Final = "approve"
DENY: Final = "deny"
SCOPES: Final = ("once", "session", "always")
APPROVAL_OPTIONS: Final = ("deny", "approve_once", "approve_session", "approve_always")

# Agent states for `status` frames
IDLE, THINKING, WAITING_APPROVAL, RUNNING_TOOL, ERROR = (
    "idle", "thinking", "waiting_approval", "running_tool", "error")

# Roles (PROTOCOL §2)
OWNER, MEMBER, SPECTATOR = "owner", "member", "spectator"
ROLES: Final = (OWNER, MEMBER, SPECTATOR)
CAN_SEND = frozenset({OWNER, MEMBER})
CAN_DECIDE = frozenset({OWNER, MEMBER})
CAN_MANAGE = frozenset({OWNER})

# Error codes (PROTOCOL §5, plus a few of our own)
NOT_FOUND, FORBIDDEN, INVALID = "not_found", "forbidden", "invalid"
UNKNOWN_TOOL_CALL, ALREADY_DECIDED = "unknown_tool_call", "already_decided"
NOT_CLIENT_CALL = "not_client_call"  # a client answered a call that the server executes
CONFLICT = "conflict"


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
def issued_claim(call_id: str) -> str: return f"issued:{call_id}"
def exec_claim(call_id: str) -> str: return f"exec:{call_id}"

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


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def started_by(event: Event) -> str | None:
    """The process (`instance`) that began running a tool call with this event, if it did.

    A `tool_started` event does, and so does an approving decision that started the call in the
    same append (the usual case: one write between "approved" and "running").
    """
    if event.get("kind") == TOOL_STARTED or (event.get("decision") and event.get("instance")):
        return event["instance"]
    return None


def is_client_name(name: str) -> bool:
    return name.startswith(CLIENT_PREFIX)


def sender_of(member: str) -> str:
    """The `sender` of a human's message: `human:<member name>`."""
    return f"human:{member}"


def trail_tag(call_id: str) -> str:
    """Every event about one tool call: the call, its approval, the decision, the start, the result."""
    return f"trail:{call_id}"


SERVER_SENDER: Final = "server"
