"""Choosing the storage: embedded (SQLite + in-process bus) or distributed (Redis for both)."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO

from .bus.base import Bus
from .bus.memory import MemoryBackend
from .log.base import EventLog

SQLITE_FILE = "agent-world.sqlite3"
DEFAULT_PREFIX = "aw"  # of Redis keys and channels


class DataDirError(OSError):
    """The data folder cannot be created or written."""


async def open_backends(*, data_dir: Path, redis_url: str | None,
                        redis_prefix: str = DEFAULT_PREFIX) -> tuple[EventLog, Bus]:
    """The event log and a connected bus.

    No `redis_url`: SQLite at `data_dir/agent-world.sqlite3` and an in-process bus.
    A `redis://` or `rediss://` URL: Redis for both, shared by every process using that URL and
    `redis_prefix` (the namespace of its keys and channels). `redis+cluster://host:port` (any node):
    a Redis Cluster, each world's keys on one slot, its channel sharded (see `cluster_url`).
    """
    if not redis_url:
        from .log.sqlite import SqliteLog

        path = _writable(Path(data_dir)) / SQLITE_FILE
        _private_file(path)  # SQLite gives its -wal and -shm files the database's mode
        log: EventLog = await SqliteLog.open(path)
        bus = Bus(MemoryBackend())
    elif redis_url.startswith(("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")):
        from .bus.redis import RedisBackend
        from .log.redis.log import RedisLog

        log = await RedisLog.open(redis_url, redis_prefix)
        bus = Bus(RedisBackend(redis_url, prefix=redis_prefix))
    else:
        raise ValueError(f"unsupported Redis URL {redis_url.split('@')[-1]!r}: "
                         "expected redis://host:port/db, rediss://…, or redis+cluster://host:port for a Redis Cluster")
    try:
        await bus.connect()
    except BaseException:
        with contextlib.suppress(Exception):
            await log.close()
        raise
    return log, bus


def cluster_url(redis_url: str) -> str:
    """`redis_url` as a Redis Cluster URL (what `--redis-cluster` does to `--redis-url`)."""
    if "+cluster://" in redis_url:
        return redis_url
    return redis_url.replace("redis://", "redis+cluster://", 1).replace("rediss://", "rediss+cluster://", 1)


def _private_file(path: Path) -> None:
    """`path` created (if missing) and kept readable by this user only: the data is every world's."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)


def _writable(data_dir: Path) -> Path:
    """`data_dir`, created if missing and closed to other users (0700); a clear error if it cannot be written."""
    if data_dir.exists() and not data_dir.is_dir():
        raise DataDirError(f"the data folder {data_dir} is not a folder")
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(data_dir, 0o700)  # also a folder made before, or by hand
    except OSError as exc:
        raise DataDirError(f"cannot create the data folder {data_dir}: {exc.strerror or exc}") from exc
    try:  # a real write is the only sure test: root passes every os.access() check
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except OSError as exc:
        raise DataDirError(f"the data folder {data_dir} is not writable: {exc.strerror or exc}") from exc
    return data_dir


class DataDirLock:
    """An exclusive lock on a data folder: one embedded server per folder (its engine assumes it)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "server.lock"
        self._file: IO[bytes] | None = None

    def acquire(self) -> DataDirLock:
        import fcntl

        handle = os.fdopen(os.open(_writable(self.path.parent) / self.path.name, os.O_WRONLY | os.O_CREAT, 0o600), "wb")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise DataDirError(f"another agent-world server is using the data folder {self.path.parent}") from None
        self._file = handle
        return self

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing drops the flock
            self._file = None
