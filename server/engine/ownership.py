"""The one place that decides whether a `role: "tool"` message from a client may be applied."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .. import vocab
from ..errors import AppError
from ..log import Tag
from ..vocab import Event
from .actors import Actor
from .store import Store


@dataclass(frozen=True)
class Target:
    """What a client's tool message answers: an approval request, or a client tool's call."""
    kind: Literal["approval", "client_call"]
    event: Event  # the assistant message that issued the id
    origin: Event | None = None  # for an approval: the open assistant message of the call it asks about


async def refuse(store: Store, world: str, actor: Actor, code: str, message: str,
                 tool_call_id: object = None) -> AppError:
    """Audit a refusal and return the error to raise. Nothing else is written or run."""
    ref = tool_call_id if isinstance(tool_call_id, str) else None
    await store.append(world, {"kind": vocab.REFUSED, "sender": actor.sender, "role_of_sender": actor.role,
                               "code": code, "message": message, "tool_call_id": ref[:200] if ref else None},
                       [Tag(vocab.AUDIT_TAG)])
    return AppError(code, message)


async def resolve(store: Store, world: str, tool_call_id: object, actor: Actor) -> Target:
    """The pending item `tool_call_id` answers, or raise the refusal (each with its own code)."""
    log = store.log
    if not isinstance(tool_call_id, str) or not tool_call_id or len(tool_call_id) > 200:
        raise await refuse(store, world, actor, vocab.INVALID, "tool_call_id must be a non-empty string",
                           tool_call_id)
    if actor.role not in vocab.CAN_DECIDE:
        raise await refuse(store, world, actor, vocab.FORBIDDEN,
                           f"a {actor.role} may not decide approvals or answer tools", tool_call_id)
    # Everything the id could answer, in one read: an approval (with the call it asks about),
    # a browser-run call, or a server-run one.
    asked_about = vocab.call_id_of_approval(tool_call_id)
    keys = [vocab.approval_key(tool_call_id), vocab.client_call_key(tool_call_id), vocab.call_key(tool_call_id)]
    found = await log.get_open_many(world, keys + ([vocab.call_key(asked_about)] if asked_about else []))
    if (event := found.get(keys[0])) is not None:
        return Target("approval", event, found.get(vocab.call_key(asked_about)) if asked_about else None)
    if (event := found.get(keys[1])) is not None:
        return Target("client_call", event)
    if found.get(keys[2]) is not None:
        raise await refuse(store, world, actor, vocab.NOT_CLIENT_CALL,
                           f"{tool_call_id} is run by the server, not answered by a client", tool_call_id)
    if await log.is_claimed(world, vocab.issued_claim(tool_call_id)):
        raise await refuse(store, world, actor, vocab.ALREADY_DECIDED,
                           f"{tool_call_id} was already decided or answered", tool_call_id)
    raise await refuse(store, world, actor, vocab.UNKNOWN_TOOL_CALL,
                       f"no tool call {tool_call_id} was issued in this world", tool_call_id)
