"""Large event bodies in the SQLite log, stored as pieces, each written in a transaction of its own.

SQLite has one writer. Written in one transaction, a 16 MiB tool result held it for 32 ms, and every other
world's appends (a decision, a message) waited behind it. So a body over `PIECE_BYTES` goes in first, a
piece at a time, each a short transaction that other appends can come between; then the event's own
transaction checks that its pieces are all there, writes its row with an empty body, and a `pieced` row
naming them. Until that commits, no read sees them.

A body's pieces are `pending` from its first piece until its event names them. Pending pieces whose event
never committed (the append failed, or its process died between the two) are dropped: at once when the
append fails, and otherwise by a sweep of those pending for longer than `ORPHAN_AGE` (another process
sharing the file may be writing its pieces right now) and not being written by this process.
"""
from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Collection

from .failures import StorageError

PIECE_BYTES = 1024 * 1024  # about 2 ms of the writer each
ORPHAN_AGE = 3600.0  # seconds

SCHEMA = """
CREATE TABLE IF NOT EXISTS pieces (blob INTEGER NOT NULL, part INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (blob, part));
CREATE TABLE IF NOT EXISTS pending (blob INTEGER PRIMARY KEY, began REAL NOT NULL);
CREATE TABLE IF NOT EXISTS pieced (world TEXT NOT NULL, seq INTEGER NOT NULL, blob INTEGER NOT NULL UNIQUE,
    bytes INTEGER NOT NULL, PRIMARY KEY (world, seq)) WITHOUT ROWID;
"""

# An event's size in a search step: its pieces', if its body is in pieces (`length` of a BLOB reads no body).
SIZE = ("CASE WHEN length(body)>0 THEN length(body) ELSE COALESCE((SELECT bytes FROM pieced d "
        "WHERE d.world=events.world AND d.seq=events.seq), 0) END")
# Whether a pieced event holds the pattern: each piece with the start of the next (as many bytes as the
# needle has, less one), so a match across two pieces is found once (a needle longer than a piece, never
# at 1 MiB, would be missed across three). Binds (overlap, pattern).
PIECES_LIKE = ("(length(body)=0 AND EXISTS (SELECT 1 FROM pieced d JOIN pieces p ON p.blob=d.blob "
               "LEFT JOIN pieces q ON q.blob=p.blob AND q.part=p.part+1 "
               "WHERE d.world=events.world AND d.seq=events.seq "
               "AND CAST(p.data || COALESCE(substr(q.data, 1, ?), x'') AS TEXT) LIKE ? ESCAPE '\\'))")


def new_blob() -> int:
    """A name for one body's pieces: random, since several processes may write to one file."""
    return secrets.randbits(62)


def put(db: sqlite3.Connection, blob: int, part: int, data: memoryview) -> None:
    """Write one piece, in a transaction of its own; the first also marks the body pending. A sweep may
    have taken the pieces before (their writer stopped for longer than its age): then nothing more is
    written, and the append fails."""
    with db:  # BEGIN ... COMMIT (or ROLLBACK)
        db.execute("BEGIN IMMEDIATE")
        if part == 0:
            db.execute("INSERT INTO pending (blob, began) VALUES (?, ?)", (blob, time.time()))
        elif db.execute("SELECT 1 FROM pending WHERE blob=?", (blob,)).fetchone() is None:
            raise _lost("a large event")
        db.execute("INSERT INTO pieces (blob, part, data) VALUES (?, ?, ?)", (blob, part, data))


def name(db: sqlite3.Connection, world: str, seq: int, blob: int, size: int) -> None:
    """Name `blob`'s pieces as the body of `seq` (inside the event's transaction), once they are all there."""
    [(total,)] = db.execute("SELECT total(length(data)) FROM pieces WHERE blob=?", (blob,))
    if db.execute("DELETE FROM pending WHERE blob=?", (blob,)).rowcount != 1 or int(total) != size:
        raise _lost(f"a {size}-byte event")
    db.execute("INSERT INTO pieced (world, seq, blob, bytes) VALUES (?, ?, ?, ?)", (world, seq, blob, size))


def _lost(what: str) -> StorageError:
    return StorageError(f"the pieces of {what} were lost before it was written (swept as left by a process "
                        f"that died): nothing was stored")


def read(db: sqlite3.Connection, world: str, seq: int) -> tuple[bytes, ...]:
    """The pieces of `seq`'s body, in order (joined where they are decoded, off this thread)."""
    return tuple(data for (data,) in db.execute(
        "SELECT p.data FROM pieced d JOIN pieces p ON p.blob=d.blob WHERE d.world=? AND d.seq=? ORDER BY p.part",
        (world, seq)))


def drop_pending(db: sqlite3.Connection, blobs: Collection[int]) -> int:
    """Drop the pieces of `blobs` that are still pending (no event names them); returns how many bodies."""
    if not blobs:
        return 0
    marks = ",".join("?" * len(blobs))
    with db:
        db.execute("BEGIN IMMEDIATE")
        pending = [blob for (blob,) in db.execute(f"SELECT blob FROM pending WHERE blob IN ({marks})", tuple(blobs))]
        for blob in pending:
            db.execute("DELETE FROM pieces WHERE blob=?", (blob,))
            db.execute("DELETE FROM pending WHERE blob=?", (blob,))
    return len(pending)


def stale(db: sqlite3.Connection, age: float, writing: Collection[int]) -> list[int]:
    """The bodies pending for longer than `age` seconds, but for those in `writing`."""
    return [blob for (blob,) in db.execute("SELECT blob FROM pending WHERE began<?", (time.time() - age,))
            if blob not in writing]
