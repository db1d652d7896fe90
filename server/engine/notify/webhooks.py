"""Outgoing webhooks (docs/notifications.md): each event a world's webhook asks for is sent once, by one
process, off the request path, and its outcome written to the log.

Every process that hosts the world hears the event; each tries to claim its delivery (`webhook_sending`
with a `Claim` keyed by the event's seq and the webhook), and the one whose write wins sends it, with
retries and exponential backoff for at most `retry_for` seconds, then writes `webhook_delivered` or
`webhook_failed` (in the audit).

A delivery under way is an open work item (`vocab.delivery_key`), closed by its outcome, so a process that
dies while sending does not leave it undone: every process hosting the world watches the deliveries other
processes are sending, and once the sender's process lease has lapsed (as agents' turns are taken over:
checked every lease period; at once in the embedded mode, where a restart is the only other process), one
of them claims it again (`vocab.takeover_claim`) and sends it for what is left of `retry_for`, counted from
the event. The receiver may get a try twice (the dead process's last one): `X-Agent-World-Delivery` is the
same, so it can drop the repeat."""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Literal

from ... import events, vocab
from ...aio import import_in_thread, keep
from ...log import Claim, Close, Conflict, Op, Open, Tag
from ...log.codec import encode
from ...log.failures import StorageError
from ...vocab import Event
from ...webhooks.payloads import TYPES, slack, subject, summary
from ...webhooks.settings import hook_id, target_host
from ...webhooks.signing import HEADER, signature
from ..approvals.decisions import parse_time
from ..calls.backoff import in_background
from ..hosting.leases import ProcessLease
from ..public import public
from ..store import Store
from ..world.worlds import Worlds

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger(__name__)
Outcome = tuple[Literal["webhook_delivered", "webhook_failed"], dict[str, int | str]]


class Webhooks:
    def __init__(self, store: Store, worlds: Worlds, leases: ProcessLease) -> None:
        self.store = store
        self.worlds = worlds
        self.leases = leases  # whether the process sending a delivery still lives
        self.instance = leases.instance
        self.public_url: str | None = None  # where the queue's link points (server/app.py sets it)
        self.retry_for = 600.0  # seconds a delivery is retried for, at most
        self.first_wait, self.max_wait = 1.0, 60.0  # seconds between tries: doubling from the first
        self.request_timeout = 10.0  # seconds one try may take
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sessions: dict[bool, aiohttp.ClientSession] = {}  # by allow_private
        self._watched: dict[tuple[str, str], asyncio.Task[None]] = {}  # others' deliveries under way, by key

    def heard(self, world: str, event: Event) -> None:
        """An event of `world` (from any process): the deliveries it calls for are tried here; another
        process's delivery is watched until it ends, in case that process dies first."""
        kind = event.get("kind")
        if kind == vocab.WEBHOOK_SENDING and event.get("instance") != self.instance:
            self._watch(world, event)
        elif kind in (vocab.WEBHOOK_DELIVERED, vocab.WEBHOOK_FAILED):
            key = vocab.delivery_key(int(event["source_seq"]), str(event["hook"]))
            if (watch := self._watched.pop((world, key), None)) is not None:
                watch.cancel()
        what = subject(event)
        if what is not None:
            keep(self._tasks, self._deliver_all(world, event, what), f"webhooks-{world}-{event.get('seq')}")

    def found_pending(self, world: str, _pending: list[Event]) -> None:
        """`world` is hosted here now: the deliveries other processes left under way are watched."""
        keep(self._tasks, self._watch_open(world), f"webhook-watch-{world}")

    async def _watch_open(self, world: str) -> None:
        try:
            for entry in await self.store.log.list_open(world, vocab.ALL_DELIVERIES):
                if entry.get("instance") != self.instance:
                    self._watch(world, entry)
        except StorageError as exc:  # hosting it again looks again
            logger.warning("webhook deliveries under way in %s not looked at: %s", world, exc)

    def _watch(self, world: str, sending: Event) -> None:
        key = vocab.delivery_key(int(sending["source_seq"]), str(sending["hook"]))
        if (world, key) not in self._watched:
            task = asyncio.get_running_loop().create_task(self._outlive(world, key), name=f"webhook-watch-{key}")
            self._watched[(world, key)] = task
            task.add_done_callback(functools.partial(self._unwatch, (world, key)))

    def _unwatch(self, where: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._watched.get(where) is task:
            del self._watched[where]

    async def _outlive(self, world: str, key: str) -> None:
        """Wait while the delivery is under way in a live process; take it over if that process dies."""
        while True:
            try:
                entry = await self.store.log.get_open(world, key)
                if entry is None or entry.get("instance") == self.instance:
                    return  # ended, or ours now
                if not await self.leases.is_alive(str(entry["instance"])) and await self._take_over(world, entry):
                    return  # another process taking it first goes on being watched: it may die too
            except StorageError as exc:
                logger.warning("webhook delivery %s of %s not checked: %s", key, world, exc)
            except Exception:  # anything else too: a watch that ended would leave the delivery open for good
                logger.exception("webhook delivery %s of %s not taken over; checked again later", key, world)
            await asyncio.sleep(self.leases.ttl)  # a lease lapses in its ttl: no event says a process died

    async def _take_over(self, world: str, sending: Event) -> bool:
        """Claim the delivery the dead process had and send it (in the background); whether this did."""
        seq, hid, dead = int(sending["source_seq"]), str(sending["hook"]), str(sending["instance"])
        hook = next((h for h in (await self.worlds.settings(world)).get("webhooks") or () if hook_id(h) == hid), None)
        [source] = await self.store.log.read(world, seq - 1, 1)
        what, target = str(sending["subject"]), str(sending["target"])
        event = events.webhook_outcome("webhook_sending", hid, target, seq, what, self.instance, taken_from=dead)
        key = vocab.delivery_key(seq, hid)
        try:  # closed and opened again: a delivery that ended meanwhile (its close won) is not sent again
            await self.store.append(world, event, [Claim(vocab.takeover_claim(seq, hid, dead)), Close(key), Open(key)])
        except Conflict:
            return False  # another process took it over first, or it ended meanwhile
        logger.info("webhook delivery of event %s in %s taken over from %s, which died", seq, world, dead)
        left = self.retry_for - (time.time() - parse_time(str(source["ts"])).timestamp())
        keep(self._tasks, self._send_and_record(world, public(source), what, hook, target, hid, max(0.0, left)),
             f"webhook-{world}")
        return True

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

        try:  # the claim: exactly one process sends each delivery; the open item: it is under way
            await self.store.append(world, outcome("webhook_sending"), [Claim(vocab.webhook_claim(seq, hid)),
                                                                        Open(vocab.delivery_key(seq, hid))])
        except Conflict:
            return
        except StorageError as exc:
            logger.warning("webhook delivery of event %s in %s not claimed: %s", seq, world, exc)
            return
        await self._send_and_record(world, event, what, hook, target, hid, self.retry_for)

    async def _send_and_record(self, world: str, event: Event, what: str, hook: dict[str, Any] | None,
                               target: str, hid: str, retry_for: float) -> None:
        """Send a claimed delivery (tries for `retry_for` seconds), then write its outcome and close it."""
        seq = int(event["seq"])
        kind: Literal["webhook_delivered", "webhook_failed"] = "webhook_failed"
        fields: dict[str, int | str] = {"attempts": 0, "error": "the webhook was removed"}
        if hook is not None:  # None: removed from the settings while a dead process had it
            link = f"{self.public_url}/w/{world}" if self.public_url else None
            body = summary(world, event, what, link)
            data = encode(slack(world, body) if hook.get("format") == "slack" else body).encode()
            kind, fields = await self._send(hook, data, TYPES[what], f"{seq}-{hid}", retry_for)
        done = events.webhook_outcome(kind, hid, target, seq, what, self.instance, **fields)
        ops: list[Op] = [Tag(vocab.AUDIT_TAG), Close(vocab.delivery_key(seq, hid), must_exist=False)]
        await in_background(lambda: self.store.append(world, done, ops),
                            f"record webhook delivery {seq}-{hid} of {world}")

    async def _send(self, hook: dict[str, Any], data: bytes, kind: str, delivery: str, retry_for: float) -> Outcome:
        await import_in_thread("server.webhooks.client")  # aiohttp: at the first delivery, not at start-up
        from ...webhooks import client

        allow_private = bool(hook.get("allow_private"))

        async def post() -> tuple[int, str | None]:
            headers = {"Content-Type": "application/json", "User-Agent": "agent-world-webhooks",
                       "X-Agent-World-Event": kind, "X-Agent-World-Delivery": delivery}
            if hook.get("secret"):  # signed anew for each try: its time is the try's
                headers[HEADER] = signature(hook["secret"], int(time.time()), data)
            return await client.post_once(self._session(allow_private), hook["url"], data, headers,
                                          self.request_timeout, checked=not allow_private)
        tried = await client.post_retrying(post, client.Backoff(retry_for, self.first_wait, self.max_wait))
        if tried.taken:
            return "webhook_delivered", {"attempts": tried.attempts, "status": tried.status or 0}
        return "webhook_failed", {"attempts": tried.attempts, "error": tried.error,
                                  **({"status": tried.status} if tried.status is not None else {})}

    def _session(self, allow_private: bool) -> aiohttp.ClientSession:
        from ...webhooks import client

        session = self._sessions.get(allow_private)
        if session is None or session.closed:
            session = self._sessions[allow_private] = client.session(checked=not allow_private, limit=50)
        return session

    async def stop(self) -> None:
        for task in [*self._tasks, *self._watched.values()]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._watched.values(), return_exceptions=True)
        self._watched.clear()
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
