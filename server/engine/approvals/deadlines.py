"""Approval deadlines (docs/protocol.md §4): requests that time out, time-boxed grants that end, and the
requests denied in bulk (an agent's cancelled, a deleted chat's) rather than by a person one by one."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ... import events, vocab
from ...aio import cancel_all, keep
from ...errors import AppError
from ...events import request_id
from ...log import Close, Conflict, Tag
from ...log.failures import StorageError
from ...vocab import Event
from ..actors import SYSTEM, Actor
from ..calls.backoff import in_background
from .decisions import request_of

if TYPE_CHECKING:
    from ...log import EventLog
    from ..store import Store
    from .policy import PolicyResult

logger = logging.getLogger(__name__)


def parse_ts(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


class Deadlines:
    """A part of `Approvals` (a mixin): the attributes below, and the methods declared for the type
    checker, are Approvals' own."""

    store: Store
    log: EventLog
    _timers: dict[str, asyncio.TimerHandle]
    _tasks: set[asyncio.Task[Any]]

    if TYPE_CHECKING:
        async def pending(self, world: str, agent: str | None = None) -> list[Event]: ...
        async def decide(self, world: str, approval: Event, content: object, actor: Actor,
                         origin: Event | None = None, policy: PolicyResult | None = None) -> Event: ...

    # -- time-boxed grants --------------------------------------------------
    def schedule_grant_end(self, world: str, grant: dict[str, Any]) -> None:
        """Arm this process's timer for a time-boxed grant's end (`expires_at`). Checks compare with the
        time now, so this is only for everyone to see it go: the first process to close the grant writes
        `grant_expired`, the others (and a revocation first) find it closed and write nothing."""
        end = grant.get("expires_at")
        if not isinstance(end, str):
            return
        key = f"grant:{grant['id']}"
        delay = (parse_ts(end) - datetime.now(UTC)).total_seconds()
        self._cancel_timer(key)
        self._timers[key] = asyncio.get_running_loop().call_later(max(delay, 0), self._end_grant_later, world, grant)

    def _end_grant_later(self, world: str, grant: dict[str, Any]) -> None:
        self._timers.pop(f"grant:{grant['id']}", None)
        keep(self._tasks, in_background(lambda: self.end_grant(world, grant), f"end grant {grant['id']}"),
             f"end-{grant['id']}")

    async def end_grant(self, world: str, grant: dict[str, Any]) -> bool:
        """Close a time-boxed grant whose end passed, once in the whole log; whether this call did."""
        if not isinstance(grant.get("expires_at"), str) or datetime.now(UTC) < parse_ts(grant["expires_at"]):
            return False
        try:
            await self.store.append(world, events.grant_expired(grant["id"], grant["expires_at"]),
                                    [Close(vocab.grant_key(grant["chat"], grant["id"])), Tag(vocab.AUDIT_TAG)])
        except Conflict:
            return False  # revoked, or ended by another process first
        return True

    # -- timeouts and cancellation -------------------------------------------
    def schedule_timeout(self, world: str, approval: Event) -> None:
        """Arm this process's timer for a request's stored deadline (`expiresAt`).

        Every process arms one for every pending request it hosts or hears of, so the deadline holds
        whichever of them is still alive; the first to close the request wins, the others find it
        decided and write nothing.
        """
        expires = request_of(approval).get("expiresAt")
        if not expires:
            return
        approval_id = request_id(approval)
        delay = (parse_ts(expires) - datetime.now(UTC)).total_seconds()
        self._cancel_timer(approval_id)
        self._timers[approval_id] = asyncio.get_running_loop().call_later(
            max(delay, 0), self._expire_later, world, approval_id)

    def _cancel_timer(self, approval_id: str) -> None:
        timer = self._timers.pop(approval_id, None)
        if timer:
            timer.cancel()

    async def _now_or_later(self, job: Callable[[], Awaitable[int]], what: str) -> int:
        """`job`, which follows a write already made; while the log cannot take it (a full disk, Redis
        gone), it is tried again with backoff in the background (0 done now), so the write is not failed."""
        try:
            return await job()
        except StorageError as exc:
            logger.warning("could not %s (%s): trying again in the background", what, exc)
            keep(self._tasks, in_background(job, what), what)
            return 0

    def _expire_later(self, world: str, approval_id: str) -> None:
        # While the log cannot take the denial, it is tried again with backoff: the deadline is never
        # dropped (another process may hold none).
        self._timers.pop(approval_id, None)
        keep(self._tasks, in_background(lambda: self._expire(world, approval_id), f"time out {approval_id}"),
                    f"expire-{approval_id}")

    async def _expire(self, world: str, approval_id: str) -> None:
        """Close a request whose deadline passed."""
        approval = await self.log.get_open(world, vocab.approval_key(approval_id))
        if approval is not None:  # not decided meanwhile, here or elsewhere
            await self.close_unanswered(world, approval, SYSTEM, "timed out", timeout=True)

    async def cancel(self, world: str, actor: Actor, agent: str) -> int:
        """Deny every pending approval of `agent` ("cancelled"); returns how many."""
        actor.require(vocab.CAN_DECIDE, "cancel approvals")
        count = 0
        for approval in await self.pending(world, agent):
            count += await self.close_unanswered(world, approval, actor, f"cancelled by {actor.name}")
        return count

    async def deny_in_chat(self, world: str, actor: Actor, chat: str, reason: str) -> int:
        """Deny every pending approval asked in `chat` (a deleted chat's); returns how many. While the log
        cannot take a denial (a full disk, Redis gone), they are tried again with backoff in the
        background: the chat is gone, and nothing else would deny them."""
        return await self._now_or_later(lambda: self._deny_in_chat(world, actor, chat, reason),
                                        f"deny the pending approvals of chat {chat} in {world}")

    async def _deny_in_chat(self, world: str, actor: Actor, chat: str, reason: str) -> int:
        count = 0
        for approval in await self.pending(world):
            if approval.get("chat") == chat:
                count += await self.close_unanswered(world, approval, actor, reason)
        return count

    async def close_unanswered(self, world: str, approval: Event, actor: Actor, reason: str,
                               timeout: bool = False) -> int:
        """Deny `approval` for `reason` unless it was decided meanwhile; 1 if this closed it, else 0."""
        content: dict[str, object] = {"decision": vocab.DENY, "reason": reason}
        if timeout:
            content["timeout"] = True
        try:
            event = await self.decide(world, approval, content | {"scope": "once"}, actor)
        except AppError as exc:
            if exc.code != vocab.ALREADY_DECIDED:
                logger.warning("could not close approval: %s", exc.message)
            return 0
        return 1 if event else 0

    async def stop(self) -> None:
        await cancel_all(self._timers, self._tasks)
