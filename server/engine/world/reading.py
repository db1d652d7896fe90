"""What clients read of a world through the engine: its live events and log, the pending queues, rules
and grants, search and export, the snapshot after a replay, the audit."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ... import vocab
from ...bus import Subscription
from ...events import request_id
from ...redact import redact
from ...vocab import Event
from ..approvals.audit import audit_entry
from ..approvals.decisions import approvals_required, pending_entry, queue_entry, request_of
from ..calls.refs import CallRef
from ..public import public, public_agent, public_off_loop
from ..store import channel
from .find import chat_markdown, search

if TYPE_CHECKING:
    from ..approvals.deciding import Approvals
    from ..hosting.hosted import Hosting
    from ..store import Store
    from .status import StatusBoard
    from .worlds import Worlds


def _voted(vote: Event | None) -> list[str]:
    """Who approved so far (people, kept on the server), from a request's latest vote."""
    return list((vote or {}).get("voted") or []) if vote and vote.get("decision") else []


class Reading:
    """A part of `Engine` (a mixin): the attributes below, and the methods declared for the type
    checker, are the engine's."""

    store: Store
    worlds: Worlds
    approvals: Approvals
    status: StatusBoard
    hosting: Hosting

    if TYPE_CHECKING:
        async def pending_questions(self, world: str) -> list[dict[str, Any]]: ...
        async def list_chats(self, world: str) -> list[dict[str, Any]]: ...

    @asynccontextmanager
    async def subscribe(self, world: str, maxsize: int = 1000) -> AsyncIterator[Subscription]:
        """The world's live events (and frames), from now on: subscribe before reading the log. The world
        is hosted here meanwhile (a socket's subscription: its agents answer, its status is kept)."""
        async with self.hosting.connected(world), self.store.bus.subscribe(channel(world), maxsize=maxsize) as sub:
            yield sub

    async def tagged(self, world: str, tags: list[str], limit: int) -> list[Event]:
        """The newest `limit` events carrying any of `tags`, oldest first."""
        return await self.store.log.read_tagged(world, tags, limit=limit, newest=True)

    async def events(self, world: str, after: int = 0, limit: int = 1000) -> list[Event]:
        """A page of the world's log as clients may see it (`public`: secrets in arguments hidden; a large
        event redacted off the loop)."""
        return [await public_off_loop(event) for event in await self.store.log.read(world, after, limit)]

    async def pending_approvals(self, world: str) -> list[dict[str, Any]]:
        """Every pending approval, oldest first, with who approved so far where several must."""
        pending = await self.approvals.pending(world)
        several = any(approvals_required(request_of(e)) > 1 for e in pending)
        votes = await self.approvals.votes(world) if several else {}
        return [pending_entry(await public_off_loop(e), votes.get(request_id(e)),
                              await self.approvals.may_decide(world, e, _voted(votes.get(request_id(e)))))
                for e in pending]

    # -- find and take away (world/find.py) ------------------------------------
    async def search(self, world: str, query: object, chat: object = None, limit: int = 50) -> list[Event]:
        """Messages of `world` (or of one chat) holding `query`, newest first, redacted; any role may search."""
        return await search(self.store, self.worlds, world, query, chat, limit)

    async def export_chat(self, world: str, chat: str) -> tuple[str, str]:
        """The chat as Markdown (redacted), and a file name for it."""
        return await chat_markdown(self.store, self.worlds, world, chat)

    # -- rules, grants, client calls, the snapshot, the audit ------------------
    async def rules(self, world: str) -> list[dict[str, Any]]:
        """The world's open always-rules as clients see them (secret-looking globs hidden)."""
        return [public(e)["rule"] for e in await self.approvals.rules(world)]

    async def grants(self, world: str, chat: str | None = None) -> list[dict[str, Any]]:
        """Open session grants (of one chat, or all) as clients see them."""
        return [public(e)["grant"] for e in await self.approvals.grants(world, chat)]

    async def pending_client_calls(self, world: str) -> list[dict[str, Any]]:
        """Client tool calls waiting for a browser to run them (redacted: every role reads them)."""
        out = []
        for message in await self.store.log.list_open(world, vocab.ALL_CLIENT_CALLS):
            for call in CallRef.all_in(message):
                if call.location == "client" and await self.store.log.get_open(world, call.open_key):
                    out.append({"id": call.id, "agent": call.agent, "chat": call.chat, "name": call.name,
                                "arguments": redact(call.parsed_arguments()), "seq": message["seq"]})
        return out

    async def snapshot(self, world: str) -> dict[str, Any]:
        """What a client needs after a replay (docs/protocol.md §6), minus `members`, which the API layer adds."""
        last_seq = await self.store.log.last_seq(world)
        agents = [{**public_agent(a), "status": self.status.get(world, a["name"])}
                  for a in await self.worlds.agents(world)]
        return {"type": "snapshot", "last_seq": last_seq, "pending_approvals": await self.pending_approvals(world),
                "pending_client_calls": await self.pending_client_calls(world),
                "pending_elicitations": [queue_entry(q, q["elicitation"]) for q in await self.pending_questions(world)],
                "agents": agents, "chats": await self.list_chats(world)}

    async def audit(self, world: str, limit: int = 1000) -> list[dict[str, Any]]:
        await self.worlds.get(world)
        events = await self.store.log.read_tagged(world, [vocab.AUDIT_TAG], limit=limit, newest=True)
        return [audit_entry(public(e)) for e in events]
