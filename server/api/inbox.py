"""`GET /api/inbox`: the requests the caller can decide in every world they belong to (issue #31 item 7).

The worlds come from the principal: the owner's from the log's work index (engine/approvals/inbox.py), an
invitee's the one world of their invite. The same lists feed the page's live inbox (web/inbox.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..engine.actors import Actor
from ..engine.engine import Engine
from .context import Principal

if TYPE_CHECKING:
    from .http import Call


async def inbox_actors(engine: Engine, principal: Principal) -> dict[str, Actor]:
    """The worlds whose requests `principal` may see in an inbox, each with the actor they are there."""
    if principal.owner:
        worlds = await engine.inbox_worlds()
    else:
        worlds = [principal.world] if principal.world else []
    return {world: principal.actor(world) for world in worlds}


async def get_inbox(call: Call) -> dict[str, Any]:
    """GET /api/inbox: `{"requests": [...]}`, oldest first, each a pending approval (as `…/approvals/pending`
    lists it) with its `world`, `world_name` and `chat_title`."""
    actors = await inbox_actors(call.ctx.engine, call.principal)
    return {"requests": await call.ctx.engine.inbox(actors)}
