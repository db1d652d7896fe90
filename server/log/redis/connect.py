"""Connecting to Redis, as the log, the bus and the sessions do: one client per URL (plain or cluster), its
timeouts and retry, the pool's bounds, a URL safe to print, and the escaping of names inside keys."""
from __future__ import annotations

import functools
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from ..failures import StorageError

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def safe_url(url: str) -> str:
    """`url` with any password masked, for error messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
# How long one command may take before it fails (Redis paused, a network cut): an append then fails
# fast with a clear error instead of hanging a request. A script that timed out may still run once
# Redis wakes up: atomically, and it shows in the log like any event.
COMMAND_TIMEOUT = 2.0
# A command whose connection broke (Redis restarted, CLIENT KILL) is sent once more on a new one.
# An append that did run before the break is not run twice: its receipt key answers the retry.
RETRY_ONCE = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def storage_error(exc: BaseException, *, may_have_stored: bool = False) -> StorageError:
    """What Redis (or the way to it) failed with, as the log's callers catch it; raise it `from exc`.
    Every RedisError counts (a refused connection, a timeout, LOADING, CLUSTERDOWN, OOM…), and an OSError
    (the log closed while a command waited)."""
    return StorageError(str(exc) or type(exc).__name__, may_have_stored=may_have_stored)


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


POOL_SIZE = 256  # connections one client keeps at most
POOL_WAIT = 5.0  # seconds a command waits for one of them before it fails


async def connect_redis(url: str, **options: Any) -> Any:
    """A client for `url` (str replies) that answered PING, or a ConnectionError naming the URL.

    `redis+cluster://host:port` (or `rediss+cluster://`): redis-py's cluster client, any node as the seed.
    A command whose connection broke is sent once more on a new one (`RETRY_ONCE`), unless
    `options` say otherwise; a timed-out one is not (it may still run).
    """
    options.setdefault("retry", RETRY_ONCE)
    if is_cluster_url(url):
        from redis.asyncio.cluster import RedisCluster

        options.pop("client_name", None)  # set per node by the cluster client's own connections
        client: Any = RedisCluster.from_url(url.replace("+cluster", "", 1), decode_responses=True,
                                            socket_connect_timeout=5, socket_keepalive=True, **options)
    else:
        # Blocking: past its size the pool makes a caller wait for a free connection (redis-py's plain
        # pool raises MaxConnectionsError, which failed a burst of 250 WebSocket handshakes).
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=POOL_WAIT,
                                                        decode_responses=True, socket_connect_timeout=5,
                                                        socket_keepalive=True, **options)
        client = aioredis.Redis.from_pool(pool)
    try:
        if is_cluster_url(url):
            await client.initialize()
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        raise ConnectionError(f"cannot reach Redis at {safe_url(url)}: {exc}") from exc
    return client


@functools.lru_cache(maxsize=4096)  # world names, escaped for every key of every append
def escape_name(name: str) -> str:
    """`name` without braces, so a world name can neither end the hash tag nor forge a key."""
    return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
