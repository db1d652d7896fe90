"""The distributed bus backend: Redis pub/sub, so every process sees every other one's publishes.

Two kinds of connection:

- a client for PUBLISH (a publish Redis did not take raises `StorageError`). Publishes are
  queued and sent by one flusher task in pipelines, so concurrent publishers share round trips
  (one awaited PUBLISH each caps near 10k/s), and those queued meanwhile to one channel go as one
  Redis message (a "batch": `_BATCH` then a JSON list of the messages), unpacked by the receiving
  side, so a burst costs Redis, redis-py and every subscriber connection one message per channel,
  not one per event. The order of `publish` calls on a channel is kept (calls in flight together
  have no order between them across channels), and each call returns once Redis took its message.
- subscriber connections (`redis_shard.Shard`), each owned by a reader task that reconnects by
  itself: one to the server, or on a Redis Cluster one per master, with sharded pub/sub
  (SPUBLISH/SSUBSCRIBE), so a world's channel lives on the master that owns its slot.

Redis pub/sub is at-most-once: whatever is published while a subscriber connection is down is
lost. So subscribers are told: a `Gap(down=True)` when a connection drops, and a
`Gap(down=False)` once every connection is back and subscribed to every channel again (Redis
confirmed each), so that what a subscriber then reads from the event log covers all the bus missed.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
from redis.exceptions import RedisError

from ..log.failures import StorageError
from ..log.redis.connect import DEFAULT_URL, RETRY_ONCE, connect_redis, is_cluster_url, safe_url
from ..log.redis.pipelined import Pipelined
from ..log.redis.wire import Wire
from .base import Backend, Gap
from .redis_shard import Shard

logger = logging.getLogger(__name__)

_NOT_CONNECTED = "RedisBackend is not connected: call `await backend.connect()` first"
_BATCH = "\x00"  # starts a Redis message carrying several (a lone message starting so is sent as a batch of one)
_BATCH_BYTES = _BATCH.encode()


def _node_url(url: str, host: str, port: int) -> str:
    """`url` (its scheme, credentials and options) pointed at one cluster node."""
    parts = urlsplit(url.replace("+cluster", "", 1))
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{host}:{port}" if credentials else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class RedisBackend(Backend):
    def __init__(self, url: str = DEFAULT_URL, *, client_name: str = "agent-world-bus", prefix: str = "aw") -> None:
        self.url = url
        self.prefix = prefix  # deployments sharing one Redis use different prefixes: channels are f"{prefix}:{name}"
        self.client_name = client_name  # shown by CLIENT LIST on every connection
        self.cluster = is_cluster_url(url)
        self._pub: Any = None  # redis.asyncio.Redis, or RedisCluster
        self._conn: Wire | None = None  # the publisher's own connection (single server)
        self._shards: dict[str, Shard] = {}  # by node name ("" for a single server)
        # One item per Redis message (a batch), not per message in it: a burst costs one queue hop.
        self._inbox: asyncio.Queue[tuple[str, list[str]] | Gap] = asyncio.Queue()
        self._unpacked: deque[tuple[str, str]] = deque()  # the rest of the batch being handed out
        self._down: set[str] = set()  # shards whose connection is down (subscribers were told)
        self._outbox: Pipelined[tuple[str, str]] = Pipelined(self._send, "redis-bus-publisher")

    # -- lifecycle ---------------------------------------------------------------
    async def connect(self) -> None:
        """Connect both sides; a ConnectionError naming the URL if Redis is unreachable."""
        # A publish whose connection broke is sent again: a message delivered twice is harmless
        # (consumers skip seqs they have), one lost is not.
        self._pub = await connect_redis(self.url, client_name=self.client_name, retry=RETRY_ONCE)
        self._conn = None if self.cluster else Wire(self._pub)
        try:
            if self.cluster:
                for node in self._pub.get_primaries():
                    self._shards[node.name] = self._shard(_node_url(self.url, node.host, node.port))
            else:
                self._shards[""] = self._shard(self.url)
            for shard in self._shards.values():
                await shard.connect()
        except BaseException:
            await self.disconnect()
            raise

    def _shard(self, url: str) -> Shard:
        return Shard(url, client_name=self.client_name, sharded=self.cluster, deliver=self._deliver,
                     on_down=self._shard_down, on_up=self._shard_up)

    async def disconnect(self) -> None:
        await self._outbox.close(ConnectionError("the Redis bus was disconnected"))
        if self._conn is not None:
            await self._conn.close()
        for shard in self._shards.values():
            await shard.disconnect()
        self._shards.clear()
        if self._pub is not None:
            with contextlib.suppress(Exception):
                await self._pub.aclose()
        self._pub = None

    # -- subscriptions -----------------------------------------------------------
    def _wire(self, channel: str) -> str:
        """The Redis channel behind the bus channel `channel`."""
        return f"{self.prefix}:{channel}"

    def _shard_of(self, wire: str) -> Shard:
        if not self._shards:
            raise RuntimeError(_NOT_CONNECTED)
        if not self.cluster:
            return self._shards[""]
        node = self._pub.nodes_manager.get_node_from_slot(self._pub.keyslot(wire))
        return self._shards.get(node.name) or next(iter(self._shards.values()))

    async def subscribe(self, channel: str) -> None:
        wire = self._wire(channel)
        await self._shard_of(wire).subscribe(wire)

    async def unsubscribe(self, channel: str) -> None:
        wire = self._wire(channel)
        if self._shards:
            await self._shard_of(wire).unsubscribe(wire)

    async def next_published(self) -> tuple[str, str] | Gap:
        if self._unpacked:  # a batch's messages all come before anything queued after it (a Gap too)
            return self._unpacked.popleft()
        item = await self._inbox.get()
        if isinstance(item, Gap):
            return item
        channel, messages = item
        self._unpacked.extend((channel, message) for message in messages[1:])
        return channel, messages[0]

    def _deliver(self, wire: str, message: str) -> None:
        channel = wire.removeprefix(f"{self.prefix}:")
        messages = orjson.loads(message[len(_BATCH):]) if message.startswith(_BATCH) else [message]
        if messages:
            self._inbox.put_nowait((channel, messages))

    def _shard_down(self, shard: Shard) -> None:
        if not self._down:
            self._inbox.put_nowait(Gap(down=True))
        self._down.add(shard.url)

    def _shard_up(self, shard: Shard) -> None:
        self._down.discard(shard.url)
        if not self._down:
            self._inbox.put_nowait(Gap(down=False))

    # -- publishing --------------------------------------------------------------
    async def publish(self, channel: str, message: str) -> None:
        if self._pub is None:
            raise RuntimeError(_NOT_CONNECTED)
        try:
            await self._outbox.call((channel, message))
        except OSError as exc:  # disconnected while it waited
            raise StorageError(f"cannot publish to Redis at {safe_url(self.url)}: {exc}") from exc

    async def _send(self, batch: list[tuple[str, str]]) -> list[object]:
        """Publish `batch` in one pipeline: one Redis message per channel, in the order of the calls."""
        by_channel: dict[str, list[str]] = {}
        for channel, message in batch:
            by_channel.setdefault(channel, []).append(message)
        sent: list[tuple[str, str | bytes]] = [
            (self._wire(channel), messages[0] if len(messages) == 1 and not messages[0].startswith(_BATCH)
             else _BATCH_BYTES + orjson.dumps(messages)) for channel, messages in by_channel.items()]
        try:
            if self.cluster:
                async with self._pub.pipeline(transaction=False) as pipe:
                    for wire, data in sent:
                        pipe.spublish(wire, data)
                    await pipe.execute()
            else:
                if self._conn is None:
                    raise RuntimeError(_NOT_CONNECTED)
                for reply in await self._conn.send([("PUBLISH", wire, data) for wire, data in sent]):
                    if isinstance(reply, RedisError):
                        raise reply
        except (RedisError, OSError) as exc:
            raise StorageError(f"cannot publish to Redis at {safe_url(self.url)}: {exc}") from exc
        return [None] * len(batch)
