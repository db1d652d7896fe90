"""Server-side browser sessions: a random id in the cookie, its record on the server.

The cookie holds only a random session id. The store keys each record by HMAC(secret, id), where
the secret is random and kept with the data (a 0600 file, or one Redis key shared by every
process): a restart logs nobody out, a leaked store gives no usable cookie, and no cookie says
anything about the owner token. Logging out deletes the record, so the cookie ends at once.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ...log.failures import StorageError

SECRET_FILE = "session.key"
SESSIONS_FILE = "sessions.sqlite3"
MAX_AGE = 30 * 24 * 3600  # seconds a browser session lasts
T = TypeVar("T")


class SessionStore(Protocol):
    """Where session records live: keyed by the HMAC of their id, each with an expiry time."""

    secret: bytes

    async def put(self, key: str, record: dict[str, Any], ttl: int) -> None: ...

    async def get(self, key: str) -> dict[str, Any] | None: ...

    async def delete(self, key: str) -> None: ...

    async def ping(self) -> None:
        """A cheap real round trip (for /healthz); raises when the store is unreachable."""

    async def close(self) -> None: ...


def _write_private(path: Path, data: bytes) -> None:
    """Create `path` readable by this user only (0600), failing if it exists (two processes racing)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def run_sql(db: sqlite3.Connection, lock: threading.Lock, sql: str, args: tuple[Any, ...]) -> None:
    """One statement on a small store's SQLite file (sessions, push subscriptions), from a worker thread."""
    with lock:
        try:
            db.execute(sql, args)
        except sqlite3.Error as exc:  # e.g. a full disk: a 503, as for the log
            raise StorageError(str(exc)) from exc


def _file_secret(data_dir: Path) -> bytes:
    path = data_dir / SECRET_FILE
    try:
        _write_private(path, secrets.token_bytes(32).hex().encode())
    except FileExistsError:
        pass
    os.chmod(path, 0o600)  # tighten one made by hand
    secret = bytes.fromhex(path.read_text().strip())
    if len(secret) < 32:
        raise ValueError(f"{path} does not hold a 32-byte session secret: delete it to make a new one")
    return secret


class SqliteSessions:
    """The embedded mode's store: a small SQLite file beside the log (one process owns the folder).

    Reads are served from memory (the process owns every session of its folder); writes go through
    to the file on a worker thread, so the event loop never waits for the disk.
    """

    def __init__(self, data_dir: Path, secret: bytes) -> None:
        self.secret = secret
        path = data_dir / SESSIONS_FILE
        if not path.exists():
            _write_private(path, b"")
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("CREATE TABLE IF NOT EXISTS sessions (key TEXT PRIMARY KEY, record TEXT, expires REAL)")
        self._db.execute("DELETE FROM sessions WHERE expires < ?", (time.time(),))
        self._cache: dict[str, tuple[dict[str, Any], float]] = {
            key: (json.loads(record), expires)
            for key, record, expires in self._db.execute("SELECT key, record, expires FROM sessions")}

    @classmethod
    async def open(cls, data_dir: Path) -> SqliteSessions:
        def make() -> SqliteSessions:
            return cls(data_dir, _file_secret(data_dir))
        return await asyncio.to_thread(make)

    def _run(self, sql: str, args: tuple[Any, ...]) -> None:
        run_sql(self._db, self._lock, sql, args)

    async def put(self, key: str, record: dict[str, Any], ttl: int) -> None:
        expires = time.time() + ttl
        self._cache[key] = (record, expires)
        await asyncio.to_thread(self._run, "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?)",
                                (key, json.dumps(record), expires))

    async def get(self, key: str) -> dict[str, Any] | None:
        found = self._cache.get(key)
        if found is None:
            return None
        if found[1] < time.time():
            await self.delete(key)
            return None
        return found[0]

    async def delete(self, key: str) -> None:
        self._cache.pop(key, None)
        await asyncio.to_thread(self._run, "DELETE FROM sessions WHERE key = ?", (key,))

    async def ping(self) -> None:
        await asyncio.to_thread(self._run, "SELECT 1", ())

    async def close(self) -> None:
        await asyncio.to_thread(self._db.close)


def _namespace(prefix: str) -> str:
    """`{prefix}`, as the log's deployment-wide keys are named (braces in the prefix escaped)."""
    return "{" + prefix.replace("%", "%25").replace("{", "%7B").replace("}", "%7D") + "}"


class RedisSessions:
    """The distributed mode's store: one key per session with its TTL; the secret is one shared key."""

    def __init__(self, client: Any, prefix: str, secret: bytes) -> None:
        from redis.exceptions import RedisError

        self._client = client
        self._prefix = _namespace(prefix)
        self.secret = secret
        self._failures = (RedisError, OSError)  # raised as a StorageError (a 503), as the log's

    async def _do(self, command: Awaitable[T]) -> T:
        try:
            return await command
        except self._failures as exc:
            raise StorageError(str(exc)) from exc

    @classmethod
    async def open(cls, url: str, prefix: str) -> RedisSessions:
        from ...log.redis.connect import connect_redis

        client = await connect_redis(url)
        key = f"{_namespace(prefix)}:session-secret"
        await client.set(key, secrets.token_bytes(32).hex(), nx=True)  # the first process makes it
        return cls(client, prefix, bytes.fromhex(await client.get(key)))

    def _key(self, key: str) -> str:
        return f"{self._prefix}:session:{key}"

    async def put(self, key: str, record: dict[str, Any], ttl: int) -> None:
        await self._do(self._client.set(self._key(key), json.dumps(record), ex=ttl))

    async def get(self, key: str) -> dict[str, Any] | None:
        raw = await self._do(self._client.get(self._key(key)))
        return json.loads(raw) if raw else None

    async def delete(self, key: str) -> None:
        await self._do(self._client.delete(self._key(key)))

    async def ping(self) -> None:
        await self._do(self._client.ping())

    async def close(self) -> None:
        await self._client.aclose()


async def open_sessions(*, data_dir: Path, redis_url: str | None, redis_prefix: str) -> SessionStore:
    if redis_url:
        return await RedisSessions.open(redis_url, redis_prefix)
    return await SqliteSessions.open(Path(data_dir))


class Sessions:
    """Issue, resolve and end sessions; `record` is what the session stands for (owner or invitee)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    def key(self, session_id: str) -> str:
        """The keyed digest a session is stored (and its end announced) under: its id never leaves the process."""
        return hmac.new(self.store.secret, session_id.encode(), hashlib.sha256).hexdigest()

    def fingerprint(self, value: str) -> str:
        """A keyed digest of `value` (e.g. the owner token) that a session record may carry safely."""
        return hmac.new(self.store.secret, b"fingerprint:" + value.encode(), hashlib.sha256).hexdigest()

    async def issue(self, record: dict[str, Any]) -> str:
        session_id = secrets.token_urlsafe(32)
        await self.store.put(self.key(session_id), record, MAX_AGE)
        return session_id

    async def resolve(self, session_id: str) -> dict[str, Any] | None:
        if not session_id or len(session_id) > 100:
            return None
        return await self.store.get(self.key(session_id))

    async def end(self, session_id: str) -> None:
        if session_id and len(session_id) <= 100:
            await self.store.delete(self.key(session_id))
