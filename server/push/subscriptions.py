"""People's push subscriptions: one per person and device (a browser's push endpoint), kept durably.

A record is `{"id", "endpoint", "keys": {"p256dh", "auth"}, "label", "created"}`, filed under the person
it belongs to (`Principal.person`: the owner, or one invite). Embedded mode: `push.sqlite3` in the data
folder (0600), read from memory and written through on a worker thread, as the browser sessions are.
Distributed mode: one Redis hash per person, shared by every process.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..api.auth.sessions import _namespace, _write_private, run_sql
from ..log.failures import StorageError

SUBSCRIPTIONS_FILE = "push.sqlite3"
MAX_PER_PERSON = 20  # devices one person may have subscribed at once
T = TypeVar("T")


def subscription_id(endpoint: str) -> str:
    """A subscription's id: its endpoint's digest (the same device subscribing again replaces its record)."""
    return "push_" + hashlib.sha256(endpoint.encode()).hexdigest()[:24]


class Subscriptions(Protocol):
    async def put(self, person: str, record: dict[str, Any]) -> None: ...

    async def list(self, person: str) -> list[dict[str, Any]]:
        """The person's subscriptions, oldest first."""

    async def delete(self, person: str, sub_id: str) -> bool:
        """Remove one; whether it was there."""

    async def close(self) -> None: ...


class SqliteSubscriptions:
    def __init__(self, data_dir: Path) -> None:
        path = data_dir / SUBSCRIPTIONS_FILE
        if not path.exists():
            _write_private(path, b"")
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("CREATE TABLE IF NOT EXISTS subscriptions "
                         "(person TEXT, id TEXT, record TEXT, PRIMARY KEY (person, id))")
        self._cache: dict[str, dict[str, dict[str, Any]]] = {}
        for person, sub_id, record in self._db.execute("SELECT person, id, record FROM subscriptions ORDER BY rowid"):
            self._cache.setdefault(person, {})[sub_id] = json.loads(record)

    @classmethod
    async def open(cls, data_dir: Path) -> SqliteSubscriptions:
        return await asyncio.to_thread(cls, data_dir)

    def _run(self, sql: str, args: tuple[Any, ...]) -> None:
        run_sql(self._db, self._lock, sql, args)

    async def put(self, person: str, record: dict[str, Any]) -> None:
        self._cache.setdefault(person, {})[record["id"]] = record
        await asyncio.to_thread(self._run, "INSERT OR REPLACE INTO subscriptions VALUES (?, ?, ?)",
                                (person, record["id"], json.dumps(record)))

    async def list(self, person: str) -> list[dict[str, Any]]:
        return sorted(self._cache.get(person, {}).values(), key=lambda r: (r["created"], r["id"]))

    async def delete(self, person: str, sub_id: str) -> bool:
        found = self._cache.get(person, {}).pop(sub_id, None) is not None
        if found:
            await asyncio.to_thread(self._run, "DELETE FROM subscriptions WHERE person = ? AND id = ?",
                                    (person, sub_id))
        return found

    async def close(self) -> None:
        await asyncio.to_thread(self._db.close)


class RedisSubscriptions:
    def __init__(self, client: Any, prefix: str) -> None:
        self._client = client
        self._prefix = _namespace(prefix)

    @classmethod
    async def open(cls, url: str, prefix: str) -> RedisSubscriptions:
        from ..log.redis.connect import connect_redis

        return cls(await connect_redis(url), prefix)

    async def _do(self, command: Awaitable[T]) -> T:
        """Redis failing is the storage failing: a 503, as for the log and the sessions."""
        from redis.exceptions import RedisError

        try:
            return await command
        except (RedisError, OSError) as exc:
            raise StorageError(str(exc)) from exc

    def _key(self, person: str) -> str:
        return f"{self._prefix}:push:{person}"

    async def put(self, person: str, record: dict[str, Any]) -> None:
        await self._do(self._client.hset(self._key(person), record["id"], json.dumps(record)))

    async def list(self, person: str) -> list[dict[str, Any]]:
        stored = await self._do(self._client.hvals(self._key(person)))
        return sorted((json.loads(r) for r in stored), key=lambda r: (r["created"], r["id"]))

    async def delete(self, person: str, sub_id: str) -> bool:
        return bool(await self._do(self._client.hdel(self._key(person), sub_id)))

    async def close(self) -> None:
        await self._client.aclose()
