"""Outgoing webhooks (docs/notifications.md): each event a world's webhook asks for is sent once, by one
process, off the request path, and its outcome written to the log.

Every process that hosts the world hears the event; each tries to claim its delivery (`webhook_sending`
with a `Claim` keyed by the event's seq and the webhook), and the one whose write wins sends it, with
retries and exponential backoff for at most `retry_for` seconds, then writes `webhook_delivered` or
`webhook_failed` (in the audit). A process that dies while sending leaves that delivery undone."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp

from ... import events, vocab
from ...aio import keep
from ...log import Claim, Conflict, Tag
from ...log.codec import encode
from ...log.failures import StorageError
from ...vocab import Event
from ...webhooks.payloads import TYPES, slack, subject, summary
from ...webhooks.settings import hook_id, target_host
from ...webhooks.signing import HEADER, signature
from ...webhooks.targets import CheckedResolver, RefusedTarget, check_literal
from ..calls.backoff import in_background
from ..public import public
from ..store import Store
from ..world.worlds import Worlds

logger = logging.getLogger(__name__)
Outcome = tuple[Literal["webhook_delivered", "webhook_failed"], dict[str, int | str]]


def _error(exc: BaseException) -> str:
    """What failed, without the URL that aiohttp's messages carry (it is a secret)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"could not connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return type(exc).__name__


class Webhooks:
    def __init__(self, store: Store, worlds: Worlds, instance: str) -> None:
        self.store = store
        self.worlds = worlds
        self.instance = instance
        self.public_url: str | None = None  # where the queue's link points (server/app.py sets it)
        self.retry_for = 600.0  # seconds a delivery is retried for, at most
        self.first_wait, self.max_wait = 1.0, 60.0  # seconds between tries: doubling from the first
        self.request_timeout = 10.0  # seconds one try may take
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sessions: dict[bool, aiohttp.ClientSession] = {}  # by allow_private

    def heard(self, world: str, event: Event) -> None:
        """An event of `world` (from any process): the deliveries it calls for are tried here."""
        what = subject(event)
        if what is not None:
            keep(self._tasks, self._deliver_all(world, event, what), f"webhooks-{world}-{event.get('seq')}")

    async def _deliver_all(self, world: str, event: Event, what: str) -> None:
        try:
            hooks = (await self.worlds.settings(world)).get("webhooks") or []
        except StorageError as exc:
            logger.warning("webhooks of %s not sent for event %s: %s", world, event.get("seq"), exc)
            return
        for hook in hooks:
            if what in hook.get("events", ()):
                keep(self._tasks, self._deliver(world, public(event), what, hook), f"webhook-{world}")

    async def _deliver(self, world: str, event: Event, what: str, hook: dict[str, Any]) -> None:
        hid, target, seq = hook_id(hook), target_host(hook["url"]), int(event["seq"])

        def outcome(kind: Literal["webhook_sending", "webhook_delivered", "webhook_failed"],
                    **more: int | str) -> Event:
            return events.webhook_outcome(kind, hid, target, seq, what, self.instance, **more)

        try:  # the claim: exactly one process sends each delivery
            await self.store.append(world, outcome("webhook_sending"), [Claim(vocab.webhook_claim(seq, hid))])
        except Conflict:
            return
        except StorageError as exc:
            logger.warning("webhook delivery of event %s in %s not claimed: %s", seq, world, exc)
            return
        link = f"{self.public_url}/w/{world}" if self.public_url else None
        body = summary(world, event, what, link)
        data = encode(slack(world, body) if hook.get("format") == "slack" else body).encode()
        kind, fields = await self._send(hook, data, TYPES[what], f"{seq}-{hid}")
        await in_background(lambda: self.store.append(world, outcome(kind, **fields), [Tag(vocab.AUDIT_TAG)]),
                            f"record webhook delivery {seq}-{hid} of {world}")

    async def _send(self, hook: dict[str, Any], data: bytes, kind: str, delivery: str) -> Outcome:
        loop = asyncio.get_running_loop()
        deadline, wait, attempts = loop.time() + self.retry_for, self.first_wait, 0
        allow_private = bool(hook.get("allow_private"))
        while True:
            attempts += 1
            status: int | None = None
            try:
                if not allow_private:
                    check_literal(urlsplit(hook["url"]).hostname or "")
                headers = {"Content-Type": "application/json", "User-Agent": "agent-world-webhooks",
                           "X-Agent-World-Event": kind, "X-Agent-World-Delivery": delivery}
                if hook.get("secret"):
                    headers[HEADER] = signature(hook["secret"], int(time.time()), data)
                async with self._session(allow_private).post(
                        hook["url"], data=data, headers=headers, allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=self.request_timeout)) as response:
                    status = response.status
                    await response.read()
                if 200 <= status < 300:
                    return "webhook_delivered", {"attempts": attempts, "status": status}
                error, again = f"HTTP {status}", status >= 500 or status in (408, 429)
            except RefusedTarget as exc:
                return "webhook_failed", {"attempts": attempts, "error": str(exc)}
            except (aiohttp.ClientError, TimeoutError) as exc:
                error, again = _error(exc), True
            failed: dict[str, int | str] = {"attempts": attempts, "error": error,
                                             **({"status": status} if status is not None else {})}
            if not again or loop.time() + wait > deadline:
                return "webhook_failed", failed
            await asyncio.sleep(wait)
            wait = min(wait * 2, self.max_wait)

    def _session(self, allow_private: bool) -> aiohttp.ClientSession:
        session = self._sessions.get(allow_private)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(resolver=None if allow_private else CheckedResolver(), limit=50)
            session = self._sessions[allow_private] = aiohttp.ClientSession(connector=connector, trust_env=False)
        return session

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
