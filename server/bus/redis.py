"""The distributed bus backend: Redis pub/sub, so every process sees every other one's publishes.

Two kinds of connection:

- a pool for PUBLISH. Publishes are queued and sent by one flusher task in pipelines, so
  concurrent publishers share round trips (one awaited PUBLISH each caps near 10k/s);
  the order of `publish` calls is kept, and each call returns once Redis took its message.
- one subscriber connection, owned by a reader task. When it drops, the reader reconnects by
  itself (exponential backoff with jitter) and subscribes again to every channel.

Redis pub/sub is at-most-once: whatever is published while the subscriber connection is down
is lost. Consumers notice the gap by `seq` and catch up from the event log.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from ..log.redis import DEFAULT_URL, connect_redis, safe_url
from ..aio import cancel_and_wait
from .base import Backend

log = logging.getLogger(__name__)

_MIN_DELAY = 0.05  # seconds before the first reconnect attempt
_MAX_DELAY = 5.0  # backoff ceiling
_CONFIRM_TIMEOUT = 5.0  # how long subscribe() waits for Redis to confirm the subscription
_NOT_CONNECTED = "RedisBackend is not connected: call `await backend.connect()` first"


class RedisBackend(Backend):
    def __init__(self, url: str = DEFAULT_URL, *, client_name: str = "agent-world-bus", prefix: str = "aw") -> None:
        self.url = url
        self.prefix = prefix  # deployments sharing one Redis use different prefixes: channels are f"{prefix}:{name}"
        self.client_name = client_name  # shown by CLIENT LIST on both connections
        self._pub: aioredis.Redis | None = None
        self._sub: aioredis.Redis | None = None
        self._pubsub: PubSub | None = None  # the live subscriber connection; None while down
        self._channels: set[str] = set()
        self._confirms: dict[str, deque[asyncio.Future[None]]] = {}
        self._inbox: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._outbox: list[tuple[str, str, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------
    async def connect(self) -> None:
        """Connect both sides; a ConnectionError naming the URL if Redis is unreachable."""
        self._pub = await connect_redis(self.url, client_name=self.client_name)
        try:
            # No retries inside redis-py on the subscriber side: the reader owns reconnection.
            self._sub = await connect_redis(self.url, client_name=self.client_name,
                                            retry=Retry(NoBackoff(), 0))
            pubsub = await self._open_pubsub()
        except BaseException:
            await self.disconnect()
            raise
        self._reader = asyncio.create_task(self._read_forever(pubsub), name="redis-bus-reader")

    async def disconnect(self) -> None:
        for task in (self._reader, self._flusher):
            await cancel_and_wait(task)
        self._reader = self._flusher = None
        self._fail_outbox(ConnectionError("the Redis bus was disconnected"))
        self._release_confirms()
        if self._pubsub is not None:
            pubsub, self._pubsub = self._pubsub, None
            with contextlib.suppress(Exception):
                await pubsub.aclose()
        for client in (self._pub, self._sub):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()
        self._pub = self._sub = None

    # -- subscriptions -----------------------------------------------------------
    def _wire(self, channel: str) -> str:
        """The Redis channel behind the bus channel `channel`."""
        return f"{self.prefix}:{channel}"

    async def subscribe(self, channel: str) -> None:
        """Subscribe and wait until Redis confirms, so a publish right after is not missed."""
        self._channels.add(channel)
        pubsub = self._pubsub
        if pubsub is None:
            return  # down: the reader subscribes to every channel when it is back
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._confirms.setdefault(channel, deque())
        waiters.append(confirmed)
        try:
            await pubsub.subscribe(self._wire(channel))
            async with asyncio.timeout(_CONFIRM_TIMEOUT):  # not wait_for: it can swallow a cancel on 3.11
                await asyncio.shield(confirmed)
        except (RedisError, OSError):
            pass  # the connection broke: the reader reconnects and subscribes again
        except TimeoutError:
            log.warning("Redis did not confirm the subscription to %s in time", channel)
        finally:
            with contextlib.suppress(ValueError):
                waiters.remove(confirmed)
            if not waiters and self._confirms.get(channel) is waiters:
                del self._confirms[channel]

    async def unsubscribe(self, channel: str) -> None:
        self._channels.discard(channel)
        pubsub = self._pubsub
        if pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.unsubscribe(self._wire(channel))

    async def next_published(self) -> tuple[str, str]:
        return await self._inbox.get()

    # -- publishing --------------------------------------------------------------
    async def publish(self, channel: str, message: str) -> None:
        if self._pub is None:
            raise RuntimeError(_NOT_CONNECTED)
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.append((channel, message, sent))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="redis-bus-flusher")
        await sent

    async def _flush(self) -> None:
        """Send queued publishes, everything queued so far in one pipeline, until none is left."""
        while self._outbox and self._pub is not None:
            batch, self._outbox = self._outbox, []
            try:
                async with self._pub.pipeline(transaction=False) as pipe:
                    for channel, message, _ in batch:
                        pipe.publish(self._wire(channel), message)
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                error = ConnectionError(f"cannot publish to Redis at {safe_url(self.url)}: {exc}")
                for _, _, sent in batch:
                    if not sent.done():
                        sent.set_exception(error)
            else:
                for _, _, sent in batch:
                    if not sent.done():
                        sent.set_result(None)

    def _fail_outbox(self, error: Exception) -> None:
        batch, self._outbox = self._outbox, []
        for _, _, sent in batch:
            if not sent.done():
                sent.set_exception(error)

    # -- the subscriber connection -------------------------------------------------
    async def _open_pubsub(self) -> PubSub:
        """A new subscriber connection, subscribed to every channel, published as `_pubsub`."""
        if self._sub is None:
            raise RuntimeError(_NOT_CONNECTED)
        pubsub = self._sub.pubsub()
        try:
            await pubsub.connect()
            # Published before taking the channel list: a concurrent subscribe() either added its
            # channel already (and is in the list) or will send it on this connection itself.
            self._pubsub = pubsub
            if self._channels:
                await pubsub.subscribe(*map(self._wire, self._channels))
        except BaseException as exc:
            self._pubsub = None
            with contextlib.suppress(Exception):
                await pubsub.aclose()
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
                    log.info("Redis bus reconnected to %s", safe_url(self.url))
                    delay = _MIN_DELAY
                await self._read(pubsub)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:  # ConnectionError is an OSError
                log.warning("Redis bus connection to %s lost (%s); reconnecting in %.2fs",
                            safe_url(self.url), exc, delay)
            except Exception:  # never let a surprise end delivery for good
                log.exception("Redis bus reader failed; reconnecting in %.2fs", delay)
            self._pubsub = None
            self._release_confirms()
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                pubsub = None
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, _MAX_DELAY)

    async def _read(self, pubsub: PubSub) -> None:
        while True:
            msg = await pubsub.get_message(timeout=None)
            if msg is None:
                continue
            kind, channel = msg["type"], (msg["channel"] or "").removeprefix(f"{self.prefix}:")
            if kind == "message":
                if channel in self._channels:
                    self._inbox.put_nowait((channel, msg["data"]))
            elif kind == "subscribe":
                waiters = self._confirms.get(channel)
                if waiters:
                    confirmed = waiters.popleft()
                    if not confirmed.done():
                        confirmed.set_result(None)

    def _release_confirms(self) -> None:
        """Stop subscribe() waiting on a dead connection: the next one subscribes to everything."""
        for waiters in self._confirms.values():
            for confirmed in waiters:
                if not confirmed.done():
                    confirmed.set_result(None)
        self._confirms.clear()
