"""Retry: an agent answers again, with a new LLM call on the same input, after its reply failed
(an `agent_error`) or was stopped (a message marked `stopped`).

A `turn_retried` event reopens the agent's turn in that chat. It is in the agent's memory, so that
`prepare_input` leaves the stopped partial reply out (the input is the one the failed call had, plus
whatever was said since) and the turn limit counts from it, as from any person's message.
"""
from __future__ import annotations

from ... import events, vocab
from ...errors import AppError
from ...log import Claim, Close, Conflict, Open, Tag
from ...vocab import Event
from ..actors import Actor
from ..approvals.ownership import Refusals
from ..store import Store
from ..world.worlds import Worlds

RETRY = "retry agents' replies"


def retryable(event: Event, agent: str) -> bool:
    """Whether `event` is a failed or stopped reply of `agent`."""
    if event.get("agent") != agent or not event.get("chat"):
        return False
    return event.get("kind") == vocab.AGENT_ERROR or (
        event.get("kind") == vocab.MESSAGE and event.get("role") == "assistant" and bool(event.get("stopped")))


def retryable_key(agent: str, chat: str) -> str:
    """Open while `agent`'s last reply in `chat` failed or was stopped: that reply opens it, any later reply
    closes it, and a retry must close it, so a retry and an answer cannot both win (one write decides)."""
    return f"retryable:{agent}:{chat}"


def retried_claim(seq: int) -> str:
    return f"retried:{seq}"  # a failed reply is retried once, however many ask at the same moment


async def retry_reply(store: Store, worlds: Worlds, refusals: Refusals, world: str, actor: Actor, agent: str,
                seq: object) -> Event:
    """Reopen `agent`'s turn after its failed or stopped reply at `seq`; the runner then calls the LLM again."""
    await refusals.require(world, actor, vocab.CAN_SEND, RETRY)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise AppError(vocab.INVALID, "seq must be the seq of the failed or stopped reply")
    await worlds.agent(world, agent)  # not_found for an unknown agent
    found = await store.log.read(world, seq - 1, 1)
    failed = found[0] if found and found[0]["seq"] == seq else None
    if failed is None or not retryable(failed, agent):
        raise AppError(vocab.INVALID, f"event {seq} is not a failed or stopped reply of {agent}")
    chat = str(failed["chat"])
    await worlds.require_chat(world, chat)
    memory = vocab.memory_tag(chat, agent)
    later = await store.log.read_tagged(world, [memory], after=seq)
    if any(e.get("role") == "assistant" and e.get("sender") == agent for e in later):
        raise AppError(vocab.CONFLICT, f"{agent} has answered since: nothing to retry")
    event = events.turn_retried(chat, agent, actor.sender, actor.identity, seq, failed.get("id"))
    try:
        return await store.append(world, event, [
            Claim(retried_claim(seq)), Close(retryable_key(agent, chat)), Open(vocab.turn_key(agent, chat)),
            Tag(memory), Tag(vocab.AUDIT_TAG)])
    except Conflict as exc:
        if exc.key == retryable_key(agent, chat):  # an answer came between the check above and this write
            raise AppError(vocab.CONFLICT, f"{agent} has answered since: nothing to retry") from None
        raise AppError(vocab.CONFLICT, f"{agent} is already answering in this chat, or this reply was retried "
                                       "already") from None
