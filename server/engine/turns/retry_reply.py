"""Retry: an agent answers again, with a new LLM call on the same input, after its reply failed
(an `agent_error`) or was stopped (a message marked `stopped`); or regenerate any other reply of it.

A `turn_retried` event reopens the agent's turn in that chat. It is in the agent's memory, so that
`prepare_input` leaves the stopped partial reply out (the input is the one the failed call had, plus
whatever was said since) and the turn limit counts from it, as from any person's message.

A `reply_regenerated` event does the same for a reply that did not fail: the reply and whatever its agent
did after it in the chat are superseded in its memory (supersede.py; the log keeps them, the page shows
them as earlier versions), and the agent's next reply is the new version (`version_of`, `version`).
Approvals still pending on what is superseded are denied, saying why.
"""
from __future__ import annotations

from ... import events, vocab
from ...errors import AppError
from ...log import Claim, Close, Conflict, Open, Tag
from ...vocab import Event
from ..actors import Actor
from ..approvals.deciding import Approvals
from ..approvals.ownership import Refusals
from ..store import Store
from ..world.worlds import Worlds
from .supersede import superseded

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


def regenerable(event: Event, agent: str) -> bool:
    """Whether `event` is a reply of `agent` that a regeneration may replace."""
    return (event.get("kind") == vocab.MESSAGE and event.get("role") == "assistant" and event.get("sender") == agent
            and bool(event.get("chat")) and bool(event.get("id")))


async def deny_superseded(approvals: Approvals, world: str, actor: Actor, agents: list[str], chat: str,
                          after: int, reason: str) -> int:
    """Deny the approvals of `agents` in `chat` asked after seq `after` (what an edit or a regeneration
    superseded: no call of a superseded reply may run); how many."""
    count = 0
    for approval in await approvals.pending(world):
        if approval.get("agent") in agents and approval.get("chat") == chat and approval["seq"] > after:
            count += await approvals.close_unanswered(world, approval, actor, reason)
    return count


async def retry_reply(store: Store, worlds: Worlds, refusals: Refusals, approvals: Approvals, world: str,
                      actor: Actor, agent: str, seq: object) -> Event:
    """Reopen `agent`'s turn after its failed or stopped reply at `seq`, or regenerate its reply at `seq`;
    the runner then calls the LLM again."""
    await refusals.require(world, actor, vocab.CAN_SEND, RETRY)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise AppError(vocab.INVALID, "seq must be the seq of the failed or stopped reply")
    await worlds.agent(world, agent)  # not_found for an unknown agent
    found = await store.log.read(world, seq - 1, 1)
    failed = found[0] if found and found[0]["seq"] == seq else None
    if failed is not None and not retryable(failed, agent) and regenerable(failed, agent):
        return await _regenerate(store, worlds, approvals, world, actor, agent, failed)
    if failed is None or not retryable(failed, agent):
        raise AppError(vocab.INVALID, f"event {seq} is not a reply of {agent}")
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


async def _regenerate(store: Store, worlds: Worlds, approvals: Approvals, world: str, actor: Actor, agent: str,
                      reply: Event) -> Event:
    """A new version of `reply`: superseded with what `agent` did after it, and the turn opened again."""
    chat, seq = str(reply["chat"]), int(reply["seq"])
    await worlds.require_chat(world, chat)
    memory = vocab.memory_tag(chat, agent)
    since = await store.log.read_tagged(world, [memory, vocab.shared_memory_tag(chat)], after=seq - 1)
    if seq in superseded(since, agent):
        raise AppError(vocab.CONFLICT, "this version was superseded: regenerate the newest version of the reply")
    # The turn must be over (a reply in the making would follow the new version), or waiting on people
    # for calls of what is superseded: those requests are denied below.
    waiting = [a for a in await approvals.pending(world, agent) if a.get("chat") == chat and a["seq"] > seq]
    event = events.reply_regenerated(chat, agent, actor.sender, actor.identity, reply)
    try:
        stored = await store.append(world, event, [
            Claim(retried_claim(seq)), Open(vocab.turn_key(agent, chat), new=not waiting),
            Tag(memory), Tag(vocab.AUDIT_TAG)])
    except Conflict as exc:
        if exc.key == retried_claim(seq):
            raise AppError(vocab.CONFLICT, "this reply was regenerated already: regenerate its newest version") \
                from None
        raise AppError(vocab.CONFLICT, f"{agent} is answering in this chat: stop it, or wait for its reply") from None
    await deny_superseded(approvals, world, actor, [agent], chat, seq,
                          f"superseded: {actor.name} regenerated {agent}'s reply")
    return stored
