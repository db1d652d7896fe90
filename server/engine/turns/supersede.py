"""What a person's edit or regeneration supersedes in an agent's memory: the one reading of it.

Nothing is removed from the log. An edit (`message_edited`) gives a person's message a new content for
every agent, and for the agents it is for, leaves out what they did after the original (their replies, their
tools' results, their failures): those replies are made again from the new version. A regeneration
(`reply_regenerated`) leaves out the reply and what its agent did after it, so the agent answers again from
the input the reply had (plus what people said since). A stopped reply that was retried (`turn_retried`) is
left out as well.
"""
from __future__ import annotations

from collections.abc import Sequence

from ... import vocab
from ...vocab import Event


def edits(memory: Sequence[Event]) -> dict[str, str]:
    """The latest content of each edited message in `memory`, by the message's id."""
    return {str(e["message_id"]): str(e["content"]) for e in memory if e.get("kind") == vocab.MESSAGE_EDITED}


def _own(event: Event, agent: str) -> bool:
    """What `agent` itself did: its replies, its calls' requests and results, its failures and turn-limit notices."""
    return event.get("agent") == agent and event.get("kind") in (vocab.MESSAGE, vocab.AGENT_ERROR, vocab.NOTICE)


def superseded(memory: Sequence[Event], agent: str) -> set[int]:
    """The seqs of the events of `memory` that `agent`'s next LLM input and turn leave out."""
    spans: list[tuple[int, int]] = []  # (first, end): own events with first <= seq < end are superseded
    retried: set[object] = set()
    for event in memory:
        kind, reply, original = event.get("kind"), event.get("reply_seq"), event.get("edit_of")
        if kind == vocab.REPLY_REGENERATED and event.get("agent") == agent and isinstance(reply, int):
            spans.append((reply, event["seq"]))
        elif kind == vocab.MESSAGE_EDITED and agent in (event.get("to") or ()) and isinstance(original, int):
            spans.append((original + 1, event["seq"]))
        elif kind == vocab.TURN_RETRIED and event.get("retry_of_id"):
            retried.add(event["retry_of_id"])
    if not spans and not retried:
        return set()
    return {e["seq"] for e in memory
            if (retried and e.get("id") in retried)
            or (_own(e, agent) and any(first <= e["seq"] < end for first, end in spans))}


def current(memory: Sequence[Event], agent: str) -> list[Event]:
    """`memory` without what is superseded for `agent` (edited messages keep their place; `edits` has their text)."""
    gone = superseded(memory, agent)
    return [e for e in memory if e["seq"] not in gone] if gone else list(memory)
