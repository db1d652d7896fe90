"""Sending pushes: `Push.notify(world, people, payload)` tells people's devices, off the request path.

Anyone may call `notify` (the approval requests and escalations below do): it starts a background task and
returns at once. For a new request it skips those with a page open on that world now (presence: a live
connection of theirs there); an escalation reaches the people it names whatever they have open (the request
has waited while their page was open, so the page was not enough). It encrypts the payload for each of
their devices (aes128gcm, RFC 8291), signs with the server's VAPID key (RFC 8292) and posts it to the
device's push service. A device whose push service answers 404 or 410 is gone: its subscription is
dropped. An endpoint that resolves to a loopback, link-local, private or the server's own address is never
posted to (server/webhooks/targets.py, as for webhooks): a subscription is anyone's URL, and the server
must not be made to reach inside. Nor is a redirect followed (a 3xx is a failed push, as for webhooks):
those checks see only the endpoint's own address, and a push service's `Location` could name any other.

A notification tells, it never decides: its payload names the world, the agent and the tool, and links
to the world's queue; a request's arguments never go in it.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .. import vocab
from ..aio import import_in_thread
from ..api.context import Presence
from ..engine.engine import Engine
from ..engine.notify.escalation import OWNER
from ..engine.world.invites import OWNER_NAME, member_name
from ..redact import redact_text
from .keys import VapidKey
from .subscriptions import Subscriptions

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger(__name__)
TIMEOUT = 10.0  # seconds a push service has to answer
TTL = 24 * 3600  # seconds a push service may keep a notification for an offline device
GONE = (404, 410)  # the push service's words for "this subscription no longer exists"
ENDPOINT_HINT = "a push endpoint may not point there"
POSTING = 32  # tries posted at once, at most (the session's connections: 100)


def request_payload(world: str, world_name: str, event: vocab.Event) -> dict[str, Any]:
    """What a device is told of an approval request: where, who, which tool, and the queue's address."""
    request = event.get("approval") or {}
    agent, tool = str(event.get("agent") or ""), str(request.get("toolName") or "?")
    chat = str(event.get("chat") or "")
    return {"type": "approval", "world": world_name, "agent": agent, "tool": tool,
            "title": f"{world_name}: approval needed", "body": f"{agent} asks to run {tool}",
            "url": f"/w/{world}?chat={chat}#queue" if chat else f"/w/{world}#queue",
            "tag": str(event.get("id") or "")}


def escalation_payload(world: str, world_name: str, event: vocab.Event, tool: str) -> dict[str, Any]:
    """What a device is told of an escalation: the request has waited; where it waits."""
    agent, chat = str(event.get("agent") or ""), str(event.get("chat") or "")
    minutes = event.get("after_minutes") or 0
    return {"type": "escalation", "world": world_name, "agent": agent, "tool": tool,
            "title": f"{world_name}: approval waiting", "body": f"{agent}'s request to run {tool} has waited "
                                                                 f"{minutes:g} minutes: escalated to you",
            "url": f"/w/{world}?chat={chat}#queue" if chat else f"/w/{world}#queue",
            "tag": f"escalated-{event.get('approval_id') or ''}"}


def _redacted(payload: dict[str, Any]) -> dict[str, Any]:
    """Every text of the payload as a client would read it: whatever looks secret is hidden."""
    return {k: redact_text(v) if isinstance(v, str) and k not in ("url", "tag", "type") else v
            for k, v in payload.items()}


class Push:
    """The push sender of one process, started with the app (server/push/routes.py holds the routes)."""

    def __init__(self, engine: Engine, presence: Presence, subscriptions: Subscriptions, key: VapidKey,
                 subject: str, *, allow_http: bool = False, allow_private: bool = False) -> None:
        self.engine, self.presence, self.subscriptions, self.key = engine, presence, subscriptions, key
        self.subject = subject  # the VAPID `sub` claim: how a push service reaches whoever runs this server
        self.allow_http = allow_http  # plain-http endpoints (a push service on loopback, in tests) accepted
        self.allow_private = allow_private  # endpoints on loopback or private addresses too (tests only)
        self._vapid: Any = None  # py_vapid's key, made on the first push (as the session: see `_session_open`)
        self._session: aiohttp.ClientSession | None = None
        self._started = False
        self._tasks: set[asyncio.Task[None]] = set()
        # A push is tried again as a webhook is: seconds between tries, doubling, and for how long at most.
        self.first_wait, self.max_wait, self.retry_for = 1.0, 60.0, 600.0
        self.posting = asyncio.Semaphore(POSTING)  # tries posted at once (a test narrows it)

    def start(self) -> None:
        self._started = True
        self.engine.store.observers.append(self._observe)
        self.engine.escalations.on_escalated.append(self._tell_escalation)

    async def stop(self) -> None:
        self._started = False  # a push still under way makes no new session
        if self._observe in self.engine.store.observers:
            self.engine.store.observers.remove(self._observe)
        if self._tell_escalation in self.engine.escalations.on_escalated:
            self.engine.escalations.on_escalated.remove(self._tell_escalation)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def settled(self) -> None:
        """Wait for the pushes under way now (and those they start) to end."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    # -- what is told, to whom ----------------------------------------------------------
    def _observe(self, world: str, event: vocab.Event) -> None:
        """Each approval request appended by this process (so once in a deployment) tells its deciders."""
        if (event.get("kind") == vocab.MESSAGE and event.get("approval")
                and event.get("sender") == vocab.SERVER_SENDER):
            self._spawn(self._tell_request(world, event), f"push-request-{world}")

    async def _tell_request(self, world: str, event: vocab.Event) -> None:
        excluded = set(event.get("people") or ())  # those who may not approve it (they asked for it)
        people = [p for p in await self.engine.approvals.deciders(world) if p not in excluded]
        name = str((await self.engine.worlds.get(world))["name"])
        await self.send(world, people, request_payload(world, name, event))

    async def _tell_escalation(self, world: str, event: vocab.Event) -> None:
        """An escalation (written by this process: once in a deployment) tells the people its `to` names."""
        request = await self.engine.store.log.get_open(world, vocab.approval_key(str(event.get("approval_id"))))
        tool = str(((request or {}).get("approval") or {}).get("toolName") or "a tool")
        name = str((await self.engine.worlds.get(world))["name"])
        people = await self.persons_named(world, [str(n) for n in event.get("to") or ()])
        self._spawn(self.send(world, people, escalation_payload(world, name, event, tool), even_present=True),
                    f"push-escalation-{world}")

    async def persons_named(self, world: str, names: list[str]) -> list[str]:
        """The persons `escalate_to` names: "owner" is the owner; a member's name, each invite that shows it
        and may decide (a spectator is never told)."""
        wanted = set(names)
        return [person for person, (shown, role) in (await self._people(world)).items()
                if (shown in wanted and role in vocab.CAN_DECIDE) or (person == vocab.OWNER_PERSON and OWNER in wanted)]

    def notify(self, world: str, people: Iterable[str], payload: dict[str, Any]) -> None:
        """Tell `people` (persons: `vocab.OWNER_PERSON`, `vocab.invitee_person(id)`) about `world`, in the
        background: `payload` is the notification's JSON (`title`, `body`, `url`, …; no arguments)."""
        self._spawn(self.send(world, list(people), payload), f"push-{world}")

    def _spawn(self, work: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("a push failed: %s", task.exception())

    async def send(self, world: str, people: list[str], payload: dict[str, Any], *, even_present: bool = False) -> int:
        """Push `payload` to every device of each of `people` who has no page open on `world` (with
        `even_present`, to each of them), all at once (a device tried again waits for no other); how many
        pushes the push services accepted."""
        away = people if even_present else await self._away(world, people)
        data = json.dumps(_redacted(payload), ensure_ascii=False)
        devices = [(person, record) for person in away for record in await self.subscriptions.list(person)]
        return sum(await asyncio.gather(*(self._push_one(person, record, data) for person, record in devices)))

    async def _push_one(self, person: str, record: dict[str, Any], data: str) -> int:
        """`_push`, whatever fails its own failure: the other devices' pushes go on, awaited by `send`."""
        try:
            return await self._push(person, record, data)
        except Exception:
            logger.exception("push to %s failed", record.get("id"))
            return 0

    async def _away(self, world: str, people: list[str]) -> list[str]:
        """Those of `people` with no connection to `world` now (presence counts every process's)."""
        here = {(m["name"], m["role"]) for m in self.presence.members(world)}
        shown = await self._people(world)
        return [p for p in people if p in shown and shown[p] not in here]

    async def _people(self, world: str) -> dict[str, tuple[str, str]]:
        """Each person of `world` (the owner, each open invite's holder): the name and role they show."""
        shown: dict[str, tuple[str, str]] = {vocab.OWNER_PERSON: (OWNER_NAME, vocab.OWNER)}
        for entry in await self.engine.store.log.list_open(world, "invite:"):
            invite = entry["invite"]
            shown[vocab.invitee_person(invite["id"])] = (member_name(invite), str(invite.get("role")))
        return shown

    async def _push(self, person: str, record: dict[str, Any], data: str) -> int:
        """One device's push, tried again (as a webhook is) while its push service is down or busy."""
        for name in ("server.webhooks.client", "pywebpush", "py_vapid"):  # at the first push, not at start-up
            await import_in_thread(name)
        from pywebpush import WebPushException  # type: ignore[import-untyped]

        from ..webhooks import client

        endpoint = str(record["endpoint"])
        try:
            body, headers = self._sealed(endpoint, record["keys"], data)
        except (WebPushException, ValueError) as exc:  # keys the page sent that do not make a key
            logger.warning("push to %s not sent: %s", record["id"], exc)
            return 0

        async def post() -> tuple[int, str | None]:
            # A few tries at a time, each holding its turn only while it posts (not between tries): a try
            # waiting for one of the session's connections would spend its time limit waiting. Posted here,
            # not by pywebpush's `webpush_async`: it follows redirects (aiohttp's default).
            async with self.posting:
                return await client.post_once(self._session_open(), endpoint, body, headers, TIMEOUT,
                                              checked=not self.allow_private, hint=ENDPOINT_HINT)
        tried = await client.post_retrying(post, client.Backoff(self.retry_for, self.first_wait, self.max_wait))
        if tried.status in GONE:
            await self.subscriptions.delete(person, record["id"])
            logger.info("push subscription %s is gone (%s): dropped", record["id"], tried.status)
        elif not tried.taken:  # a 3xx is not followed: a failed push, the subscription kept
            logger.warning("push to %s failed after %d tries: %s", record["id"], tried.attempts, tried.error)
        return 1 if tried.taken else 0

    def _sealed(self, endpoint: str, keys: dict[str, str], data: str) -> tuple[bytes, dict[str, str]]:
        """The push's body, encrypted for the device (aes128gcm), and its headers, VAPID-signed for the
        endpoint's origin."""
        from py_vapid import Vapid  # type: ignore[import-untyped]
        from pywebpush import WebPusher

        if self._vapid is None:
            self._vapid = Vapid.from_pem(self.key.pem)
        parts = urlsplit(endpoint)
        claims = {"sub": self.subject, "aud": f"{parts.scheme}://{parts.netloc}", "exp": int(time.time()) + 12 * 3600}
        body = WebPusher({"endpoint": endpoint, "keys": keys}).encode(data.encode(), "aes128gcm")["body"]
        headers = {**self._vapid.sign(claims), "Content-Encoding": "aes128gcm", "TTL": str(TTL), "Urgency": "high"}
        return bytes(body), headers

    def _session_open(self) -> aiohttp.ClientSession:
        """The session, made on the first push: aiohttp and pywebpush are a sixth of the server's start-up."""
        from ..webhooks import client

        if not self._started:
            raise RuntimeError("Push is not started, or stopped")
        if self._session is None:  # its resolver refuses what an endpoint may not reach, on the addresses used
            self._session = client.session(checked=not self.allow_private, hint=ENDPOINT_HINT)
        return self._session
