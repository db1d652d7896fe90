"""A person edits a message they sent: a `message_edited` event with the new version.

The original stays in the log; the agents read the latest version in its place (supersede.py). For the
agents the new version is for, what they did after the original is superseded and their turn opens
again, so their replies are made again; approvals still pending on what is superseded are denied.
"""
from __future__ import annotations

from ... import events, vocab
from ...errors import AppError
from ...log import Op, Open, Tag
from ...vocab import Event
from ..actors import Actor
from ..approvals.deciding import Approvals
from ..approvals.ownership import Refusals
from ..store import Store
from ..world.worlds import Worlds
from .retry_reply import deny_superseded
from .routing import addressees

EDIT = "edit messages"


async def edit_message(store: Store, worlds: Worlds, refusals: Refusals, approvals: Approvals, world: str,
                       actor: Actor, seq: object, content: str) -> Event:
    """Edit the person's message at `seq` (`content` already checked as a message's)."""
    await refusals.require(world, actor, vocab.CAN_SEND, EDIT)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise AppError(vocab.INVALID, "seq must be the seq of a message you sent")
    found = await store.log.read(world, seq - 1, 1)
    original = found[0] if found and found[0]["seq"] == seq else None
    if original is None or original.get("kind") != vocab.MESSAGE or original.get("role") != "user" \
            or not original.get("id") or not original.get("chat"):
        raise AppError(vocab.INVALID, f"event {seq} is not a person's message")
    if vocab.person_of(original) != actor.identity:
        raise AppError(vocab.FORBIDDEN, "only the person who sent a message may edit it")
    chat = str(original["chat"])
    await worlds.require_chat(world, chat)
    to = addressees(content, [a["name"] for a in await worlds.agents(world)], sender_agent=None)
    ops: list[Op] = [Tag(vocab.shared_memory_tag(chat)), Tag(vocab.AUDIT_TAG),
                     *(Open(vocab.turn_key(agent, chat), new=False) for agent in to)]
    stored = await store.append(world, events.message_edited(original, content, to, actor.sender, actor.identity), ops)
    await deny_superseded(approvals, world, actor, to, chat, seq, f"superseded: {actor.name} edited the message")
    return stored
