"""Sending pushes: `Push.notify(world, people, payload)` tells people's devices, off the request path.

Anyone may call `notify` (the approval requests below do; an escalation may too): it starts a background
task and returns at once. For each person it skips those with a page open on that world now (presence:
a live connection of theirs there), encrypts the payload for each of their devices (aes128gcm, RFC 8291),
signs with the server's VAPID key (RFC 8292) and posts it to the device's push service. A device whose
push service answers 404 or 410 is gone: its subscription is dropped.

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
from typing import Any, cast

import aiohttp
from py_vapid import Vapid  # type: ignore[import-untyped]
from pywebpush import WebPushException, webpush_async  # type: ignore[import-untyped]

from .. import vocab
from ..api.context import Presence
from ..engine.engine import Engine
from ..engine.world.invites import OWNER_NAME, member_name
from ..redact import redact_text
from .keys import VapidKey
from .subscriptions import Subscriptions

logger = logging.getLogger(__name__)
TIMEOUT = 10.0  # seconds a push service has to answer
TTL = 24 * 3600  # seconds a push service may keep a notification for an offline device
GONE = (404, 410)  # the push service's words for "this subscription no longer exists"


def request_payload(world: str, world_name: str, event: vocab.Event) -> dict[str, Any]:
    """What a device is told of an approval request: where, who, which tool, and the queue's address."""
    request = event.get("approval") or {}
    agent, tool = str(event.get("agent") or ""), str(request.get("toolName") or "?")
    chat = str(event.get("chat") or "")
    return {"type": "approval", "world": world_name, "agent": agent, "tool": tool,
            "title": f"{world_name}: approval needed", "body": f"{agent} asks to run {tool}",
            "url": f"/w/{world}?chat={chat}#queue" if chat else f"/w/{world}#queue",
            "tag": str(event.get("id") or "")}


def _redacted(payload: dict[str, Any]) -> dict[str, Any]:
    """Every text of the payload as a client would read it: whatever looks secret is hidden."""
    return {k: redact_text(v) if isinstance(v, str) and k not in ("url", "tag", "type") else v
            for k, v in payload.items()}


class Push:
    """The push sender of one process, started with the app (server/push/routes.py holds the routes)."""

    def __init__(self, engine: Engine, presence: Presence, subscriptions: Subscriptions, key: VapidKey,
                 subject: str, *, allow_http: bool = False) -> None:
        self.engine, self.presence, self.subscriptions, self.key = engine, presence, subscriptions, key
        self.subject = subject  # the VAPID `sub` claim: how a push service reaches whoever runs this server
        self.allow_http = allow_http  # plain-http endpoints (a push service on loopback, in tests) accepted
        self._vapid = Vapid.from_pem(key.pem)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        self.engine.store.observers.append(self._observe)

    async def stop(self) -> None:
        if self._observe in self.engine.store.observers:
            self.engine.store.observers.remove(self._observe)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._session is not None:
            await self._session.close()

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

    async def send(self, world: str, people: list[str], payload: dict[str, Any]) -> int:
        """Push `payload` to every device of each of `people` who has no page open on `world`; how many
        pushes the push services accepted."""
        away = await self._away(world, people)
        data = json.dumps(_redacted(payload), ensure_ascii=False)
        sent = 0
        for person in away:
            for record in await self.subscriptions.list(person):
                sent += await self._push(person, record, data)
        return sent

    async def _away(self, world: str, people: list[str]) -> list[str]:
        """Those of `people` with no connection to `world` now (presence counts every process's)."""
        here = {(m["name"], m["role"]) for m in self.presence.members(world)}
        shown: dict[str, tuple[str, str]] = {vocab.OWNER_PERSON: (OWNER_NAME, vocab.OWNER)}
        for entry in await self.engine.store.log.list_open(world, "invite:"):
            invite = entry["invite"]
            shown[vocab.invitee_person(invite["id"])] = (member_name(invite), str(invite.get("role")))
        return [p for p in people if p in shown and shown[p] not in here]

    async def _push(self, person: str, record: dict[str, Any], data: str) -> int:
        info = {"endpoint": record["endpoint"], "keys": record["keys"]}
        claims: dict[str, str | int] = {"sub": self.subject, "exp": int(time.time()) + 12 * 3600}
        try:
            await webpush_async(info, data, vapid_private_key=self._vapid, vapid_claims=claims,
                                ttl=TTL, headers={"Urgency": "high"}, aiohttp_session=self._session,
                                timeout=cast(Any, aiohttp.ClientTimeout(total=TIMEOUT)))
        except WebPushException as exc:
            status = getattr(exc.response, "status", None)
            if status in GONE:
                await self.subscriptions.delete(person, record["id"])
                logger.info("push subscription %s is gone (%s): dropped", record["id"], status)
            else:
                logger.warning("push to %s failed: %s", record["id"], exc.message)
            return 0
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            logger.warning("push to %s failed: %s", record["id"], exc)
            return 0
        return 1
