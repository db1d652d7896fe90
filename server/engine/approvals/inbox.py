"""One inbox for every world (issue #31 item 7): the requests a person can decide, in every world they belong to.

Which worlds: the owner's come from the log's work index (a pending request is work), never from a scan of
every world, and at most `INBOX_WORLDS` of them; an invitee's is the one world they were invited to. A world
where the person cannot decide (a spectator's) contributes nothing. Entries are the queue's own
(`Engine.pending_approvals`: redacted, with votes), plus where they belong; deciding one goes through
`Engine.submit_tool_result`, like every other decision.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ... import vocab
from ...errors import AppError
from ..actors import Actor

if TYPE_CHECKING:  # the engine is the façade this reads through; it imports this module's callers, not this
    from ..engine import Engine

INBOX_WORLDS = 200  # worlds one inbox looks at (and one live inbox subscribes to)
INBOX_ITEMS = 500  # requests one inbox lists, the oldest first


async def worlds_with_requests(engine: Engine, limit: int = INBOX_WORLDS) -> list[str]:
    """Worlds that may have pending requests: the work index (read, not scanned), the first `limit`."""
    return (await engine.store.log.worlds_with_work())[:limit]


async def pending_count(engine: Engine, world: str) -> int:
    """How many requests wait in `world` (an index read)."""
    return len(await engine.approvals.pending(world))


async def inbox(engine: Engine, actors: Mapping[str, Actor], limit: int = INBOX_ITEMS) -> list[dict[str, Any]]:
    """Every request the `actors` (one per world) can decide, oldest first, at most `limit`: the queue's
    entry with `world`, `world_name` and `chat_title` added."""
    out: list[dict[str, Any]] = []
    for world, actor in actors.items():
        if actor.role not in vocab.CAN_DECIDE or not await engine.worlds.exists(world):
            continue
        try:
            pending = await engine.pending_approvals(world)
            info = await engine.worlds.get(world) if pending else None
        except AppError as exc:
            if exc.code != vocab.NOT_FOUND:
                raise
            continue  # deleted since `exists`: a deletion wakes every inbox that follows the world
        if not pending or info is None:
            continue
        titles = {c["id"]: c.get("title") or c["id"] for c in info["chats"]}
        out += [{**entry, "world": world, "world_name": info["name"], "chat_title": titles.get(entry["chat"],
                                                                                             entry["chat"])}
                for entry in pending]
    out.sort(key=lambda e: (str(e["ts"]), e["world"], e["seq"]))
    return out[:limit]


async def pending_counts(engine: Engine) -> dict[str, int]:
    """Requests waiting per world, for the worlds of the owner's inbox (those of the work index that have some)."""
    counts = {world: await pending_count(engine, world) for world in await worlds_with_requests(engine)}
    return {world: n for world, n in counts.items() if n}
