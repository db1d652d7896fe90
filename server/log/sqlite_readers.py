"""The embedded log's readers: READERS connections, each on a thread of its own. The last one takes only
quick reads (by key: the open items, heads, claims and leases that deciding an approval or starting a
call reads), so those never wait behind a bulk read (a page's replay of a long history, a search step,
a list). Each read goes to the reader with the least in hand, a bulk read counting as BULK_WEIGHT quick
ones: a quick read to any reader (the quick one on a tie), a bulk read to a bulk one. So quick reads
queue behind a replay only once the quick reader has that much in hand (a burst of them, as listing
worlds makes, is shared). (A quick read of an event stored in pieces reads them all there: a few
milliseconds for 16 MiB.)

With one reader, one world's replay held every other world's reads behind it: a read by key every 2 ms
beside one or two clients replaying pages of 1,000 events took 1.3-2.5 ms at the median, and 0.11-0.14
with a reader of its own (bench/log_contention.py). In WAL mode every read sees each commit made before it
began, whichever connection makes it; two reads in flight at once were never ordered (each is its own
transaction).
"""
from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from .failures import StorageError

T = TypeVar("T")
READERS = 2  # one for bulk reads, one kept for quick ones (it takes no bulk read)
QUICK_KEYS = 10  # open items a read by key may ask for and still be a quick one
BULK_WEIGHT = 20  # quick reads (about 0.1 ms each) that one bulk read (a page of 1,000 events: 2 ms) stands for


@dataclass
class _Reader:
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="sqlite-read"))
    db: sqlite3.Connection | None = None
    in_hand: int = 0  # reads given to it and not yet done, weighed (counted on the event loop)


def _done(reader: _Reader, weight: int) -> None:
    reader.in_hand -= weight


class Readers:
    def __init__(self, path: str, count: int = READERS) -> None:
        self._path = path
        self._readers = [_Reader() for _ in range(count)]
        self._bulk = self._readers[:-1] or self._readers  # (one reader alone takes everything)
        self._quick = self._readers[-1]

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA query_only=ON")
        db.execute("PRAGMA busy_timeout=5000")
        return db

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            for reader in self._readers:
                reader.db = await loop.run_in_executor(reader.pool, self._connect)
        except sqlite3.Error as exc:
            raise StorageError(str(exc)) from exc

    async def run(self, fn: Callable[..., T], *args: object, quick: bool = False) -> T:
        """`fn(connection, *args)` on a reader's thread (`quick`: a few rows by key); SQLite's errors as a
        StorageError."""
        # min keeps the first of equals: the quick reader, for a quick read.
        reader = min([self._quick, *self._bulk] if quick else self._bulk, key=lambda r: r.in_hand)
        db = reader.db
        if db is None:
            raise RuntimeError("the SQLite log is closed")
        loop, weight = asyncio.get_running_loop(), 1 if quick else BULK_WEIGHT
        future = reader.pool.submit(fn, db, *args)
        reader.in_hand += weight
        # Counted out when the thread is done with it, not when its caller stops waiting (cancelled): a
        # reader still reading must not look free.
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(_done, reader, weight))
        try:
            return await asyncio.wrap_future(future)
        except sqlite3.Error as exc:
            raise StorageError(str(exc)) from exc

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for reader in self._readers:
            db, reader.db = reader.db, None
            if db is not None:
                await loop.run_in_executor(reader.pool, db.close)
            reader.pool.shutdown(wait=True)
