"""A running call's connections in the `ask` network mode (server/tools/egress/), decided as tool calls are.

The proxy of a call asks here for each connection to a host:port. The world's rules and grants of the
`network` tool (`{"tool": "network", "match": {"host": "*.pypi.org:443"}}`) decide it first, as
`evaluate` decides a call; else it becomes a request in the calling agent's queue, made by
`Approvals.request_item` and decided through `Approvals.decide` like any other (scopes, reasons, rules,
the two-person rule, the timeout), with an id of its own: the call's approval id and `.net<n>`, its
n-th asked connection (call ids never hold a `.`, so no call's own request can have it). A call's
connections to one host:port wait for one request; at most MAX_ASKED requests of a call are open at
once (past them a connection is refused with 429, not queued). The proxy's
connection waits for the decision as it passes on the world's bus channel, written by any process
(after a gap in the bus, the log is read); a connection whose call ends first closes its request.
A process that dies while a connection waits leaves its request open: when that call's result is
written (the process that recovers it reports it interrupted), the requests nobody here waits for
are closed as denied, as MCP questions are (elicitations.py).
Every connection is recorded as a `network_connection` event, in the audit and the call's trail.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from ... import events, vocab
from ...aio import keep
from ...bus import Gap, Overflow, Subscription
from ...log import Tag
from ...tools.base import Passage, ToolContext
from ...tools.egress.hosts import NETWORK_TOOL, host_port
from ...vocab import Event
from ..actors import SYSTEM
from ..calls.refs import CallRef
from ..store import Store, channel
from ..turns.memory import TurnPeople
from .deciding import Approvals
from .decisions import request_of
from .policy import PolicyResult, evaluate

logger = logging.getLogger(__name__)
MAX_ASKED = 4  # a call's connections to different hosts waiting for a person at once; more are answered 429


@dataclass
class _Shared:
    """A request a person is asked, and how many of the call's connections wait for it."""
    task: asyncio.Task[Passage]
    waiters: int = 0


def _refusal(decision: dict[str, Any], sender: str) -> str:
    """What the command is told of a denial (its connection's 403)."""
    if decision.get("timeout"):
        return "approval timed out"
    policy = decision.get("policy") or {}
    if policy:
        return str(policy.get("reason"))
    said = f": {decision['reason']}" if decision.get("reason") else ""
    return f"denied by {vocab.member_of(sender) or sender}{said}"


class NetworkRequests:
    """The engine's `Gate` (server/tools/base.py): what the proxies of the calls run here ask and record."""

    def __init__(self, store: Store, approvals: Approvals) -> None:
        self.store = store
        self.approvals = approvals
        self._asked: dict[str, int] = {}  # call id -> connections asked about so far (their ids' n)
        self._pending: dict[tuple[str, str, int], _Shared] = {}  # (call, host, port) -> its request being asked
        self._waiting: dict[str, int] = {}  # call id -> its connections waiting for a person here
        self._tasks: set[asyncio.Task[None]] = set()
        store.observers.append(self._observe)

    def _observe(self, world: str, event: Event) -> None:
        """A call's result written here: its network requests nobody here waits for are orphans (their
        process died): close them."""
        call_id = event.get("tool_call_id")
        if event.get("role") != "tool" or event.get("decision") or not isinstance(call_id, str) \
                or call_id in self._waiting:
            return
        keep(self._tasks, self._close_orphans(world, call_id), f"close-network-requests-{call_id}")

    async def _close_orphans(self, world: str, call_id: str) -> None:
        # Its requests' ids are the call's approval id and `.net<n>`: a key prefix no other call's shares.
        prefix = vocab.approval_key(f"{vocab.approval_id_for(call_id)}.net")
        try:
            for request in await self.store.log.list_open(world, prefix):
                await self.approvals.close_unanswered(world, request, SYSTEM, "the command ended before anyone decided")
        except Exception:  # it stays pending; a person's denial (or `cancel`) still closes it
            logger.warning("could not close the network requests of %s", call_id, exc_info=True)

    async def ask(self, ctx: ToolContext, tool: str, host: str, port: int) -> Passage:
        target = host_port(host, port)
        args = {"host": target}
        rules, grants = await self.approvals.rules(ctx.world), await self.approvals.grants(ctx.world, ctx.chat)
        verdict = evaluate(NETWORK_TOOL, args, agent=ctx.agent, chat=ctx.chat, rules=rules, grants=grants)
        by = {k: str(v) for k, v in verdict.source.items() if k in ("rule_id", "grant_id")}
        if verdict.verdict == "allow":
            return Passage(by=by)
        if verdict.verdict == "deny":
            return Passage(verdict.reason, by)
        key = (ctx.call_id, host, port)
        shared = self._pending.get(key)
        if shared is None:  # the call's other connections to this host:port wait for the same request
            if sum(1 for pending in self._pending if pending[0] == ctx.call_id) >= MAX_ASKED:
                return Passage(f"this call has {MAX_ASKED} connections waiting for a person already", status=429)
            shared = self._pending[key] = _Shared(asyncio.ensure_future(self._ask_person(ctx, tool, host, port,
                                                                                         verdict)))
            shared.task.add_done_callback(lambda _: self._pending.pop(key, None))
        shared.waiters += 1
        try:
            return await asyncio.shield(shared.task)
        finally:
            shared.waiters -= 1
            if not shared.waiters and not shared.task.done():  # its last connection is gone: so is the request
                shared.task.cancel()

    async def _ask_person(self, ctx: ToolContext, tool: str, host: str, port: int, verdict: PolicyResult) -> Passage:
        target = host_port(host, port)
        args = {"host": target}
        origin = await self.store.log.get_open(ctx.world, vocab.call_key(ctx.call_id))
        if origin is None:
            return Passage("the call has ended")
        count = self._asked[ctx.call_id] = self._asked.pop(ctx.call_id, 0) + 1
        while len(self._asked) > 10_000:  # recent calls only
            del self._asked[next(iter(self._asked))]
        approval_id = f"{vocab.approval_id_for(ctx.call_id)}.net{count}"
        call = CallRef(ctx.world, ctx.agent, ctx.chat, ctx.call_id, NETWORK_TOOL.name, json.dumps(args))
        chat = next((c for c in await self.approvals.worlds.chats(ctx.world) if c["id"] == ctx.chat), {})
        note = f"{ctx.agent}'s `{tool}` (in chat {chat.get('title') or ctx.chat}) wants to reach {target}"
        required = int(verdict.source.get("approvals_required") or 1)
        item = await self.approvals.request_item(
            call, NETWORK_TOOL, args, note, required=required, turn=TurnPeople.of_reply(origin),
            network={"host": host, "port": port, "tool": tool}, approval_id=approval_id)
        self._waiting[ctx.call_id] = self._waiting.get(ctx.call_id, 0) + 1
        try:
            async with self.store.bus.subscribe(channel(ctx.world)) as sub:
                request = await self.store.append(ctx.world, *item)
                try:
                    decided = await self._decision(sub, ctx.world, request)
                except asyncio.CancelledError:
                    # The call ended (or was stopped) while a person was still asked: the request goes too.
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self.approvals.close_unanswered(
                            ctx.world, request, SYSTEM, "the command ended before anyone decided"))
                    raise
        finally:
            self._waiting[ctx.call_id] -= 1
            if not self._waiting[ctx.call_id]:
                del self._waiting[ctx.call_id]
        details = decided["decision"]
        by = {"approval_id": approval_id}
        if details.get("decision") == vocab.APPROVE:
            return Passage(by=by)
        return Passage(_refusal(details, str(decided.get("sender"))), by)

    async def _decision(self, sub: Subscription, world: str, request: Event) -> Event:
        """The final decision of `request`, as it passes on the bus (after a gap in the bus, or a cut-off
        for falling behind, as the log has it), as elicitations.py `_hear` listens."""
        approval_id = request["tool_calls"][0]["id"]
        own = contextlib.AsyncExitStack()  # the subscription this waiter took itself, after a cut-off
        try:
            while True:
                try:
                    frame = json.loads(await sub.get())
                except (Gap, Overflow) as missed:
                    if isinstance(missed, Gap) and missed.down:
                        continue
                    if isinstance(missed, Overflow):  # cut off (nothing more comes on it): listen again first
                        fresh = contextlib.AsyncExitStack()
                        sub = await fresh.enter_async_context(self.store.bus.subscribe(channel(world)))
                        own, cut = fresh, own
                        await cut.aclose()  # a cut-off one of its own goes now
                    found = await self._recorded(world, request)
                    if found is not None:
                        return found
                    continue
                event: Event = frame.get("event") or {} if frame.get("type") == "event" else {}
                decision = event.get("decision")
                if event.get("tool_call_id") == approval_id and isinstance(decision, dict) \
                        and decision.get("final") is not False:
                    return event
        finally:
            await own.aclose()

    async def _recorded(self, world: str, request: Event) -> Event | None:
        approval_id = request["tool_calls"][0]["id"]
        if await self.store.log.get_open(world, vocab.approval_key(approval_id)) is not None:
            return None
        call_id = str(request_of(request)["toolCallId"])
        after = int(request["seq"])
        while found := await self.store.log.read_tagged(world, [vocab.trail_tag(call_id)], after=after, limit=1000):
            for event in found:
                decision = event.get("decision")
                if event.get("tool_call_id") == approval_id and isinstance(decision, dict) \
                        and decision.get("final") is not False:
                    return event
            after = found[-1]["seq"]
        return None

    async def record(self, ctx: ToolContext, tool: str, connection: dict[str, Any]) -> None:
        event = events.network_connection(ctx.chat, ctx.agent, ctx.call_id, tool, connection)
        await self.store.append(ctx.world, event, [Tag(vocab.AUDIT_TAG), Tag(vocab.trail_tag(ctx.call_id))])
