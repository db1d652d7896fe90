"""The embedded event log: one SQLite file (WAL) under the data folder.

SQLite work runs off the event loop on dedicated threads, each with its own connection: the writer
(appends and leases, serialized; each append with its index operations is one transaction) and the
readers (sqlite_readers.py). In WAL mode a read sees every commit made before it began and never
waits for the writer, so a read does not queue behind an append, nor an append behind a read.
A body over a MiB is written first in pieces, other appends coming between them (sqlite_pieces.py).
"""
from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from ..aio import cancel_and_wait
from ..vocab import WORK_PREFIXES, Event
from . import sqlite_pieces as pieces
from . import sqlite_tables as tables
from .base import Batched, EventLog, Op, stored_body
from .codec import Large, decoded, encode_stored_off_loop, finish, finish_opened
from .failures import StorageError
from .sqlite_readers import QUICK_KEYS, READERS, Readers

T = TypeVar("T")
logger = logging.getLogger(__name__)
CHECKPOINT_IDLE = 0.5  # seconds without an append before the WAL is copied back in the background
WAL_CAP = 64 * 2**20  # bytes: past this, the writer checkpoints between two appends (a short pause)
WAL_CHECK_EVERY = 16  # appends between two looks at the WAL's size
WAL_HARD_FACTOR = 2  # past this many caps, the writer checkpoints the WAL itself before appending on



def _checkpoint(db: sqlite3.Connection | None, mode: str) -> None:
    assert db is not None
    db.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()




class SqliteLog(EventLog):
    def __init__(self, path: str | Path, *, checkpoint_idle: float = CHECKPOINT_IDLE, wal_cap: int = WAL_CAP,
                 piece_bytes: int = pieces.PIECE_BYTES, orphan_age: float = pieces.ORPHAN_AGE,
                 readers: int = READERS) -> None:
        self._path = str(path)
        self._piece_bytes, self._orphan_age = piece_bytes, orphan_age
        self._writing: set[int] = set()  # the bodies this process is writing in pieces (not for the sweep)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-log")
        self._db: sqlite3.Connection | None = None
        self._readers = Readers(self._path, readers)
        # Checkpoints run beside the writer, not inside whichever append fills the WAL.
        self._checkpoint_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-checkpoint")
        self._checkpointer: asyncio.Task[None] | None = None
        self._checkpoint_idle, self._wal_cap = checkpoint_idle, wal_cap
        self._checkpoint_lock = threading.Lock()
        self._appends = 0  # appends so far, and when the last one was (set on the writer thread)
        self._last_append = time.monotonic()
        self._wal_full = asyncio.Event()  # set (from the writer thread) when the WAL passed its cap
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def open(cls, path: str | Path, **options: float) -> SqliteLog:
        """Open (creating if needed) the log in `path`; `options` as for the constructor."""
        log = cls(path, **options)  # type: ignore[arg-type]
        log._loop = asyncio.get_running_loop()
        await log._run(log._connect)
        await log._readers.open()
        log._checkpointer = asyncio.create_task(log._checkpoint_forever(), name="sqlite-checkpoint")
        return log

    def _connect(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # durable across a killed process; WAL keeps it fast
        db.execute("PRAGMA busy_timeout=5000")
        db.execute("PRAGMA wal_autocheckpoint=0")  # see _checkpoint_forever
        db.execute(f"PRAGMA journal_size_limit={self._wal_cap}")  # a restarted WAL file shrinks back to this
        db.executescript(tables.SCHEMA)
        if "token" not in {row[1] for row in db.execute("PRAGMA table_info(leases)")}:  # a file from before fencing
            db.execute("ALTER TABLE leases ADD COLUMN token INTEGER NOT NULL DEFAULT 0")
        self._db = db
        self._sweep_pieces()

    @property
    def wal_bytes(self) -> int:
        """The size of the write-ahead log file now (0 when there is none)."""
        try:
            return os.stat(self._path + "-wal").st_size
        except FileNotFoundError:
            return 0

    async def _checkpoint_forever(self, every: float = 0.1) -> None:
        """Copy the WAL back into the database when appends pause, and keep it under `wal_cap`.

        SQLite's automatic checkpoint runs inside whichever append fills the WAL: about 1 append
        in 100 took several milliseconds longer (bench/approvals.py). A background checkpoint
        every second while appends go on was no better — approval latency p99 rose by half — and
        it never caught up with the writer, so the WAL never restarted and grew without bound.
        So: a passive checkpoint, on a connection of its own, once appends have paused for
        `checkpoint_idle` seconds; it then usually completes, and the next append restarts the WAL.
        When steady appends fill the WAL past `wal_cap` (see `_wrote`), the same passive
        checkpoint copies nearly all of it without stopping the writer, which then copies the
        little that is left and restarts the WAL (a copy done by the writer alone took 60 ms).
        """
        loop = asyncio.get_running_loop()
        db = await loop.run_in_executor(self._checkpoint_pool, lambda: sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False))
        checkpointed = self._appends  # appends already copied back
        swept = time.monotonic()
        try:
            while True:
                try:
                    async with asyncio.timeout(every):
                        await self._wal_full.wait()
                except TimeoutError:
                    pass
                if time.monotonic() - swept > self._orphan_age:
                    swept = time.monotonic()
                    await self._run(self._sweep_pieces)
                full = self._wal_full.is_set()
                idle = time.monotonic() - self._last_append >= self._checkpoint_idle
                if self._appends == checkpointed or not (full or idle):
                    continue
                checkpointed = self._appends
                try:
                    await loop.run_in_executor(self._checkpoint_pool, self._checkpoint_locked, db, "PASSIVE")
                except sqlite3.Error as exc:  # e.g. a full disk: the WAL keeps the data; try again later
                    logger.warning("could not checkpoint %s: %s", self._path, exc)
                    continue
                if full:
                    await self._run(self._restart_wal)
                    self._wal_full.clear()
        finally:
            await loop.run_in_executor(self._checkpoint_pool, db.close)

    def _checkpoint_locked(self, db: sqlite3.Connection | None, mode: str) -> None:
        # One checkpoint at a time: SQLite refuses a second one (busy) rather than waiting for it.
        with self._checkpoint_lock:
            _checkpoint(db, mode)

    def _sweep_pieces(self) -> None:
        """Drop pieces left by an append that never committed (its process died between them and it)."""
        if self._db is None:
            return
        try:
            if dropped := pieces.drop_pending(self._db, pieces.stale(self._db, self._orphan_age, self._writing)):
                logger.info("dropped the pieces of %d events never written in %s", dropped, self._path)
        except sqlite3.Error as exc:  # e.g. a full disk: they wait for the next sweep
            logger.warning("could not sweep %s: %s", self._path, exc)

    def _restart_wal(self, mode: str = "RESTART") -> None:
        """Checkpoint on the writer's own thread, between two appends, and start the WAL over."""
        try:
            self._checkpoint_locked(self._db, mode)
        except sqlite3.Error:
            logger.exception("could not checkpoint %s", self._path)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn` on the writer's thread; SQLite's errors come out as a StorageError with SQLite's message."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except sqlite3.Error as exc:
            raise StorageError(str(exc)) from exc

    async def _read(self, fn: Callable[..., T], *args: object, quick: bool = False) -> T:
        """Run `fn(a reader's connection, *args)` on that reader's thread (sqlite_readers.py; `quick`: a
        few rows by key, never queued behind a bulk read)."""
        return await self._readers.run(fn, *args, quick=quick)

    # -- writes ------------------------------------------------------------------
    async def append_batch(self, world: str, items: Sequence[Batched]) -> list[Event]:
        if not items:
            return []
        bodies = [stored_body(world, event) for event, _ in items]
        encoded = [(await encode_stored_off_loop(b), tuple(ops)) for b, (_, ops) in zip(bodies, items, strict=True)]
        written: list[int] = []  # the pieces' names, of the bodies written in pieces
        try:
            stored = [(await self._in_pieces(body, written) if len(body) > self._piece_bytes else body, ops)
                      for body, ops in encoded]
            first = await self._run(self._append, world, stored)
        except BaseException:
            # Queued behind the append (one writer thread, in order): it drops only what the append did not
            # name, so also when a cancelled append went on to commit.
            if written:
                try:
                    self._pool.submit(self._drop_pending, tuple(written))
                except RuntimeError:  # the log was closed: a sweep drops them
                    pass
            raise
        finally:
            self._writing.difference_update(written)
        for seq, body in enumerate(bodies, start=first):
            body["seq"] = seq
        return bodies

    async def _in_pieces(self, body: bytes, written: list[int]) -> tuple[int, int]:
        """Write `body` as pieces, one transaction each; returns (its pieces' name, its size)."""
        blob = pieces.new_blob()
        written.append(blob)
        self._writing.add(blob)
        view = memoryview(body)
        for part, start in enumerate(range(0, len(body), self._piece_bytes)):
            await self._run(self._put_piece, blob, part, view[start:start + self._piece_bytes])
        return blob, len(body)

    def _put_piece(self, blob: int, part: int, data: memoryview) -> None:
        assert self._db is not None
        pieces.put(self._db, blob, part, data)
        self._wrote()

    def _drop_pending(self, blobs: tuple[int, ...]) -> None:
        if self._db is None:  # closed meanwhile: a sweep drops them
            return
        try:
            pieces.drop_pending(self._db, blobs)
        except sqlite3.Error as exc:  # a sweep drops them
            logger.warning("could not drop the pieces of a failed append in %s: %s", self._path, exc)

    def _append(self, world: str, items: list[tuple[bytes | tuple[int, int], tuple[Op, ...]]]) -> int:
        """Write `items` in one transaction; returns the first one's seq. A body that is (name, size) was
        written in pieces: its row has an empty body, and the pieces are named as its."""
        db = self._db
        assert db is not None
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT last_seq FROM heads WHERE world=?", (world,)).fetchone()
            first = seq = (row[0] if row else 0) + 1
            for body, ops in items:
                for op in ops:
                    tables.apply(db, world, seq, op)
                if isinstance(body, tuple):
                    pieces.name(db, world, seq, *body)
                db.execute("INSERT INTO events (world, seq, body) VALUES (?, ?, ?)",
                           (world, seq, b"" if isinstance(body, tuple) else body))
                seq += 1
            db.execute("INSERT INTO heads (world, last_seq) VALUES (?, ?) "
                       "ON CONFLICT(world) DO UPDATE SET last_seq=excluded.last_seq", (world, seq - 1))
            db.execute("COMMIT")
        except BaseException:
            # SQLite may have rolled back already (a full disk does): a second ROLLBACK would raise
            # "cannot rollback - no transaction is active" and hide the error that matters.
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error as rollback_error:
                    logger.warning("rollback failed after a failed append: %s", rollback_error)
            raise
        self._wrote()
        return first

    def _wrote(self) -> None:
        """Count a write (on the writer's thread), and keep the WAL in bounds."""
        self._appends += 1
        self._last_append = time.monotonic()
        # Steady appends leave no pause to checkpoint in: past the cap, have it done now, beside the
        # writer; and if that cannot keep up (a loaded machine), past twice the cap the writer does it
        # itself, before its next append: a short stall, but the WAL stays bounded.
        if self._appends % WAL_CHECK_EVERY == 0 and self._loop is not None:
            size = self.wal_bytes
            if size > WAL_HARD_FACTOR * self._wal_cap:
                self._restart_wal("TRUNCATE")  # waits for a background checkpoint under way, then copies the rest
            elif size > self._wal_cap:
                self._loop.call_soon_threadsafe(self._wal_full.set)

    # -- reads -------------------------------------------------------------------
    @staticmethod
    def _query(db: sqlite3.Connection, world: str, sql: str, args: Sequence[object]) -> list[Event | Large]:
        """The (seq, body) rows of `world`'s events that `sql` selects, each decoded, or Large."""
        # All rows first, then the decoding: stepping SQLite between decodes took 13% longer
        # for a thousand pending approvals.
        return [SqliteLog._decoded(db, world, seq, body) for seq, body in db.execute(sql, args).fetchall()]

    @staticmethod
    def _decoded(db: sqlite3.Connection, world: str, seq: int, body: bytes | str) -> Event | Large:
        # Every stored body is JSON, never empty, but one stored in pieces.
        return decoded(seq, body) if body else Large(seq, pieces.read(db, world, seq))

    async def read(self, world: str, after: int = 0, limit: int = 1000) -> list[Event]:
        return await finish(await self._read(self._query, world, "SELECT seq, body FROM events WHERE world=? "
                                             "AND seq>? ORDER BY seq LIMIT ?", (world, after, limit)))

    async def read_tagged(self, world: str, tags: Sequence[str], after: int = 0,
                          limit: int | None = None, newest: bool = False) -> list[Event]:
        if not tags:
            return []
        marks = ",".join("?" * len(tags))
        order = "DESC" if newest else "ASC"
        # Pick the (distinct) seqs first, then fetch their bodies: no body is compared or sorted.
        sql = (f"SELECT seq, body FROM events WHERE world=? AND seq IN (SELECT DISTINCT seq FROM tags "
               f"WHERE world=? AND tag IN ({marks}) AND seq>? ORDER BY seq {order} LIMIT ?) ORDER BY seq")
        return await finish(await self._read(self._query, world, sql, (world, world, *tags, after,
                                                                        -1 if limit is None else limit)))

    # LIKE over the window, not FTS5: an FTS index would double what every append writes, and need
    # building for every file of before. Each step first adds up its rows' sizes (`length` of a BLOB reads
    # no body) and, past `search_step_bytes`, finds where, going down, they run out; then it runs the LIKE
    # over that much: a read thread is never held by a LIKE over more than that (or one event).
    search_chunk = 10_000

    async def search_between(self, world: str, needle: str, low: int, high: int) -> tuple[list[Event], int]:
        pattern = "%" + needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        budget = self.search_step_bytes
        overlap = max(len(needle.encode()) - 1, 0)  # bytes of the next piece a match may run into

        def step(db: sqlite3.Connection) -> tuple[list[Event | Large], int]:
            where = "FROM events WHERE world=? AND seq>? AND seq<=?"
            reached = low
            [(total,)] = db.execute(f"SELECT SUM({pieces.SIZE}) {where}", (world, low, high)).fetchall()
            if (total or 0) > budget:  # the rare step over large events: where, going down, the bytes run out
                cut = db.execute(f"SELECT seq FROM (SELECT seq, SUM({pieces.SIZE}) OVER (ORDER BY seq DESC) AS "
                                 f"used {where}) WHERE used>? AND seq<? LIMIT 1",
                                 (world, low, high, budget, high)).fetchall()
                reached = cut[0][0] if cut else low
            return self._query(db, world, f"SELECT seq, body {where} AND (CAST(body AS TEXT) LIKE ? ESCAPE '\\' "
                               f"OR {pieces.PIECES_LIKE}) ORDER BY seq DESC",
                               (world, reached, high, pattern, overlap, pattern)), reached
        found, reached = await self._read(step)
        return await finish(found), reached

    async def get_open_many(self, world: str, keys: Sequence[str]) -> dict[str, Event]:
        def fetch(db: sqlite3.Connection) -> tuple[dict[int, Event | Large], list[tuple[str, int]]]:
            bodies: dict[int, Event | Large] = {}  # one event may open several of the keys
            opened = []
            rows = db.execute(f"SELECT o.key, e.seq, e.body FROM open_items o JOIN events e ON "
                              f"e.world=o.world AND e.seq=o.seq WHERE o.world=? AND o.key IN "
                              f"({','.join('?' * len(keys))})", (world, *keys))
            for key, seq, body in rows:
                if seq not in bodies:
                    bodies[seq] = self._decoded(db, world, seq, body)
                opened.append((key, seq))
            return bodies, opened
        return await finish_opened(*await self._read(fetch, quick=len(keys) <= QUICK_KEYS)) if keys else {}

    async def list_open(self, world: str, prefix: str) -> list[Event]:
        # Dedupe seqs first (one event may open several keys), so no body is ever compared or sorted.
        return await finish(await self._read(
            self._query, world, "SELECT seq, body FROM events WHERE world=? AND seq IN "
            "(SELECT seq FROM open_items WHERE world=? AND key>=? AND key<?) ORDER BY seq",
            (world, world, prefix, tables.prefix_end(prefix))))

    async def is_claimed(self, world: str, key: str) -> bool:
        def check(db: sqlite3.Connection) -> bool:
            return db.execute("SELECT 1 FROM claims WHERE world=? AND key=?", (world, key)).fetchone() is not None
        return await self._read(check, quick=True)

    async def last_seq(self, world: str) -> int:
        def head(db: sqlite3.Connection) -> int:
            row = db.execute("SELECT last_seq FROM heads WHERE world=?", (world,)).fetchone()
            return row[0] if row else 0
        return await self._read(head, quick=True)

    async def worlds(self, after: str = "", limit: int | None = None) -> list[str]:
        def names(db: sqlite3.Connection) -> list[str]:
            return [r[0] for r in db.execute("SELECT world FROM heads WHERE world>? ORDER BY world LIMIT ?",
                                             (after, -1 if limit is None else limit))]
        return await self._read(names)

    # The work index is the open items themselves (`open_items_by_key`): a world is in it exactly while
    # it has an open work item, so it is kept by every append's own transaction and nothing can lose it.
    async def worlds_with_work(self) -> list[str]:
        def names(db: sqlite3.Connection) -> list[str]:
            union = " UNION ".join(["SELECT world FROM open_items WHERE key>=? AND key<?"] * len(WORK_PREFIXES))
            return [r[0] for r in db.execute(union + " ORDER BY world", tables.WORK_RANGES)]
        return await self._read(names)

    async def unlist_if_idle(self, world: str) -> bool:
        def idle(db: sqlite3.Connection) -> bool:
            return db.execute(f"SELECT 1 FROM open_items WHERE world=? AND ({tables.WORK_WHERE}) LIMIT 1",
                              (world, *tables.WORK_RANGES)).fetchone() is None
        return await self._read(idle, quick=True)

    # -- leases (several processes may share one file) ------------------------------
    # A row outlives its lease (a release only ends it), so the fencing token only ever grows.
    async def lease(self, name: str, holder: str, ttl: float, *, world: str | None = None,
                    mark: bool = False) -> int:
        def take() -> int:
            assert self._db is not None
            now = time.time()
            row = self._db.execute(
                "INSERT INTO leases (name, holder, expires, token) VALUES (?, ?, ?, 1) ON CONFLICT(name) DO UPDATE SET "
                "token=CASE WHEN leases.holder=excluded.holder AND leases.expires>=? THEN leases.token "
                "WHEN ? THEN 1 ELSE leases.token+1 END, holder=excluded.holder, expires=excluded.expires "
                "WHERE leases.holder=excluded.holder OR leases.expires<? RETURNING token",
                (tables.lease_name(name, world), holder, now + ttl, now, mark, now)).fetchone()
            return row[0] if row else 0
        return await self._run(take)

    async def release(self, name: str, holder: str, *, world: str | None = None, mark: bool = False) -> None:
        def drop() -> None:
            assert self._db is not None
            # A mark's row goes with it (one per tool call); a fenced lease keeps its token for the next.
            sql = "DELETE FROM leases" if mark else "UPDATE leases SET expires=0"
            self._db.execute(f"{sql} WHERE name=? AND holder=?", (tables.lease_name(name, world), holder))
        await self._run(drop)

    async def lease_holder(self, name: str, *, world: str | None = None) -> str | None:
        def holder(db: sqlite3.Connection) -> str | None:
            row = db.execute("SELECT holder FROM leases WHERE name=? AND expires>=?",
                             (tables.lease_name(name, world), time.time())).fetchone()
            return row[0] if row else None
        return await self._read(holder, quick=True)

    async def close(self) -> None:
        await cancel_and_wait(self._checkpointer)
        self._checkpoint_pool.shutdown(wait=True)

        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
        await self._run(shut)
        self._pool.shutdown(wait=True)
        await self._readers.close()
