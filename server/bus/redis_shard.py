"""One subscriber connection of the Redis bus: to the server, or to one master of a Redis Cluster.

Owned by a reader task. When the connection drops, the reader reconnects by itself (exponential
backoff with jitter) and subscribes again to every channel; it reports `on_down` when the
connection is lost and `on_up` once Redis confirmed every renewed subscription, so that a
subscriber reading the event log after that misses nothing the bus lost.

On a cluster the shard uses sharded pub/sub (SSUBSCRIBE, Redis 7): a channel lives on the master
that owns its hash slot, and only that master's connection carries it.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ..aio import cancel_and_wait
from ..log.redis.connect import connect_redis, safe_url

logger = logging.getLogger(__name__)

_MIN_DELAY = 0.05  # seconds before the first reconnect attempt
_MAX_DELAY = 1.0  # backoff ceiling: back within about a second of Redis
_CONFIRM_TIMEOUT = 5.0  # how long subscribe() waits for Redis to confirm the subscription
# A connection silent this long is sent a PING; silent as long again, it counts as lost. A paused
# or unreachable Redis (DEBUG SLEEP, a network cut) keeps the socket open but answers nothing.
_KEEPALIVE = 1.0

Deliver = Callable[[str, str], None]  # (wire channel, message)


class Shard:
    def __init__(self, url: str, *, client_name: str, sharded: bool, deliver: Deliver,
                 on_down: Callable[[Shard], None], on_up: Callable[[Shard], None]) -> None:
        self.url = url
        self.client_name = client_name
        self.sharded = sharded  # SSUBSCRIBE / smessage rather than SUBSCRIBE / message
        self._deliver, self._on_down, self._on_up = deliver, on_down, on_up
        self._sub: Any = None
        self._pubsub: PubSub | None = None  # the live subscriber connection; None while down
        self.channels: set[str] = set()  # wire names
        self._confirms: dict[str, deque[asyncio.Future[None]]] = {}
        self._down = False  # the connection was lost and that was reported
        self._resubscribing: set[str] = set()  # channels whose renewed subscription Redis has not confirmed
        self._reader: asyncio.Task[None] | None = None

    @property
    def _kinds(self) -> tuple[str, str]:
        return ("smessage", "ssubscribe") if self.sharded else ("message", "subscribe")

    async def connect(self) -> None:
        # No retries inside redis-py: the reader owns reconnection.
        self._sub = await connect_redis(self.url, client_name=self.client_name, retry=Retry(NoBackoff(), 0))
        pubsub = await self._open_pubsub()
        self._reader = asyncio.create_task(self._read_forever(pubsub), name=f"redis-bus-reader {safe_url(self.url)}")

    async def disconnect(self) -> None:
        await cancel_and_wait(self._reader)
        self._reader = None
        self._release_confirms()
        if self._pubsub is not None:
            pubsub, self._pubsub = self._pubsub, None
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.aclose()
            self._sub = None

    async def subscribe(self, wire: str) -> None:
        """Subscribe and wait until Redis confirms, so a publish right after is not missed."""
        self.channels.add(wire)
        pubsub = self._pubsub
        if pubsub is None:
            return  # down: the reader subscribes to every channel when it is back
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._confirms.setdefault(wire, deque())
        waiters.append(confirmed)
        try:
            await self._send_subscribe(pubsub, wire)
            async with asyncio.timeout(_CONFIRM_TIMEOUT):  # not wait_for: it can swallow a cancel on 3.11
                await asyncio.shield(confirmed)
        except (RedisError, OSError):
            pass  # the connection broke: the reader reconnects and subscribes again
        except TimeoutError:
            logger.warning("Redis did not confirm the subscription to %s in time", wire)
        finally:
            with contextlib.suppress(ValueError):
                waiters.remove(confirmed)
            if not waiters and self._confirms.get(wire) is waiters:
                del self._confirms[wire]

    async def unsubscribe(self, wire: str) -> None:
        self.channels.discard(wire)
        pubsub = self._pubsub
        if pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await (pubsub.sunsubscribe(wire) if self.sharded else pubsub.unsubscribe(wire))

    async def _send_subscribe(self, pubsub: PubSub, *wires: str) -> None:
        if not self.sharded:
            await pubsub.subscribe(*wires)
            return
        for wire in wires:  # one per channel: channels of several slots in one SSUBSCRIBE are refused
            await pubsub.ssubscribe(wire)

    async def _open_pubsub(self) -> PubSub:
        """A new subscriber connection, subscribed to every channel, published as `_pubsub`."""
        if self._sub is None:
            raise RuntimeError("the Redis bus shard is not connected")
        pubsub: PubSub = self._sub.pubsub()
        try:
            await pubsub.connect()  # type: ignore[no-untyped-call]
            # Published before taking the channel list: a concurrent subscribe() either added its
            # channel already (and is in the list) or will send it on this connection itself.
            self._pubsub = pubsub
            self._resubscribing = set(self.channels) if self._down else set()
            if self.channels:
                await self._send_subscribe(pubsub, *self.channels)
            self._back_if_subscribed()
        except BaseException as exc:
            self._pubsub = None
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            if isinstance(exc, (RedisError, OSError)):
                raise ConnectionError(f"cannot reach Redis at {safe_url(self.url)}: {exc}") from exc
            raise
        return pubsub

    async def _read_forever(self, pubsub: PubSub | None) -> None:
        delay = _MIN_DELAY
        while True:
            try:
                if pubsub is None:
                    pubsub = await self._open_pubsub()
                    logger.info("Redis bus reconnected to %s", safe_url(self.url))
                    delay = _MIN_DELAY
                await self._read(pubsub)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:  # ConnectionError is an OSError
                logger.warning("Redis bus connection to %s lost (%s); reconnecting in %.2fs",
                            safe_url(self.url), exc, delay)
            except Exception:  # never let a surprise end delivery for good
                logger.exception("Redis bus reader failed; reconnecting in %.2fs", delay)
            self._pubsub = None
            self._release_confirms()
            if not self._down:
                self._down = True
                self._on_down(self)
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                pubsub = None
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, _MAX_DELAY)

    async def _read(self, pubsub: PubSub) -> None:
        message_kind, subscribe_kind = self._kinds
        pinged = False
        while True:
            msg = await pubsub.get_message(timeout=_KEEPALIVE)
            if msg is None:
                if pinged:
                    raise ConnectionError(f"no answer to PING within {_KEEPALIVE:g} s")
                await pubsub.ping()
                pinged = True
                continue
            pinged = False
            kind, wire = msg["type"], msg["channel"] or ""
            if kind == message_kind:
                if wire in self.channels:
                    self._deliver(wire, msg["data"])
            elif kind == subscribe_kind:
                if self._resubscribing:
                    self._resubscribing.discard(wire)
                    self._back_if_subscribed()
                waiters = self._confirms.get(wire)
                if waiters:
                    confirmed = waiters.popleft()
                    if not confirmed.done():
                        confirmed.set_result(None)

    def _back_if_subscribed(self) -> None:
        """After a reconnect: once every channel is subscribed again, subscribers may catch up."""
        if self._down and not self._resubscribing:
            self._down = False
            logger.info("Redis bus resubscribed to %d channels on %s", len(self.channels), safe_url(self.url))
            self._on_up(self)

    def _release_confirms(self) -> None:
        """Stop subscribe() waiting on a dead connection: the next one subscribes to everything."""
        for waiters in self._confirms.values():
            for confirmed in waiters:
                if not confirmed.done():
                    confirmed.set_result(None)
        self._confirms.clear()
