"""Escalation (the world settings `escalate_after` and `escalate_to`): a request unanswered for N minutes is
escalated once: an `approval_escalated` event (webhooks send it) and a notice in its chat. The request
stays pending; its timeout, if any, still denies it later.

Armed as approval timeouts are (server/engine/approvals/deadlines.py `schedule_timeout`): every process
that hosts the world arms a timer for each pending request when it hosts the world and when it hears a
new request, so the escalation holds whichever process is alive; the `Claim` on the event lets the first
write win, and the others write nothing."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from ... import events, vocab
from ...aio import cancel_all, keep
from ...events import request_id
from ...log import Claim, Conflict, Op, Tag
from ...log.failures import StorageError
from ...vocab import Event
from ..approvals.deadlines import parse_ts
from ..calls.backoff import in_background
from ..public import public
from ..store import Store
from ..world.worlds import Worlds

logger = logging.getLogger(__name__)
OWNER = "owner"  # in `escalate_to`: the world's owner

# Told of each escalation once, in the process that wrote it, with the world and the (public) event: a
# channel such as web push sends it to the people in the event's `to` through their subscriptions.
EscalationHook = Callable[[str, Event], Awaitable[None]]


def is_request(event: Event) -> bool:
    return (event.get("kind") == vocab.MESSAGE and event.get("approval") is not None
            and event.get("sender") == vocab.SERVER_SENDER)


class Escalations:
    def __init__(self, store: Store, worlds: Worlds) -> None:
        self.store = store
        self.worlds = worlds
        self.on_escalated: list[EscalationHook] = []  # e.g. web push: `engine.escalations.on_escalated.append(f)`
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def heard(self, world: str, event: Event) -> None:
        """An event of `world` from any process: a new request is armed; a decision disarms its request."""
        if is_request(event):
            keep(self._tasks, self.arm(world, event), f"escalation-{world}")
        elif event.get("kind") == vocab.MESSAGE and isinstance(event.get("decision"), dict) \
                and event["decision"].get("final") is not False:
            timer = self._timers.pop((world, str(event.get("tool_call_id"))), None)
            if timer is not None:
                timer.cancel()

    def found_pending(self, world: str, pending: list[Event]) -> None:
        """`world` is hosted here now, with these requests pending: each is armed."""
        for approval in pending:
            keep(self._tasks, self.arm(world, approval), f"escalation-{world}")

    async def arm(self, world: str, approval: Event) -> None:
        """This process's timer for the request's escalation: `escalate_after` minutes after it was asked."""
        try:
            minutes = (await self.worlds.settings(world)).get("escalate_after")
        except StorageError as exc:  # another process holds it too; hosting again arms it here
            logger.warning("escalation of a request in %s not armed: %s", world, exc)
            return
        if not minutes:
            return
        approval_id = request_id(approval)
        due = parse_ts(str(approval["ts"])) + timedelta(minutes=float(minutes))
        delay = max(0.0, (due - datetime.now(UTC)).total_seconds())
        key = (world, approval_id)
        if (old := self._timers.pop(key, None)) is not None:
            old.cancel()
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._due, world, approval_id)

    def _due(self, world: str, approval_id: str) -> None:
        self._timers.pop((world, approval_id), None)
        # While the log refuses the write, it is tried again with backoff: the escalation is never dropped.
        keep(self._tasks, in_background(lambda: self.escalate(world, approval_id), f"escalate {approval_id}"),
             f"escalate-{approval_id}")

    async def escalate(self, world: str, approval_id: str) -> bool:
        """Escalate the request if it is still pending and nobody escalated it yet; True if this did."""
        approval = await self.store.log.get_open(world, vocab.approval_key(approval_id))
        if approval is None or await self.store.log.is_claimed(world, vocab.escalated_claim(approval_id)):
            return False
        settings = await self.worlds.settings(world)
        to = list(settings.get("escalate_to") or ()) or [OWNER]
        minutes = settings.get("escalate_after") or 0
        request = approval.get("approval") or {}
        chat, agent = str(approval["chat"]), str(approval["agent"])
        event = events.approval_escalated(chat, agent, approval_id, to, minutes)
        notice = events.notice(chat, agent, f"{agent}'s request to run {request.get('toolName')} has waited "
                                            f"{minutes:g} minutes: escalated to {', '.join(to)}")
        ops: list[Op] = [Claim(vocab.escalated_claim(approval_id)), Tag(vocab.AUDIT_TAG),
               Tag(vocab.trail_tag(str(request.get("toolCallId"))))]
        try:
            stored, _ = await self.store.append_batch(world, [(event, ops), (notice, [])])
        except Conflict:
            return False  # another process escalated it first
        for hook in list(self.on_escalated):
            try:
                await hook(world, public(stored))
            except Exception:  # one channel's failure is its own: the escalation stands
                logger.exception("an escalation hook failed for %s in %s", approval_id, world)
        return True

    async def stop(self) -> None:
        await cancel_all(self._timers, self._tasks)
