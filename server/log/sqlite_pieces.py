"""Large event bodies in the SQLite log, stored as pieces, each written in a transaction of its own.

SQLite has one writer. Written in one transaction, a 16 MiB tool result held it for 32 ms, and every other
world's appends (a decision, a message) waited behind it. So a body over `PIECE_BYTES` goes in first, a
piece at a time, each a short transaction that other appends can come between; then the event's own
transaction writes its row, with an empty body, and a `pieced` row naming the pieces. Until that
commits, no read sees them.

Pieces whose event never committed (the append failed, or its process died between the two) are
dropped: at once when the append fails, and otherwise by a sweep of the pieces no event names that are
older than `ORPHAN_AGE` (another process sharing the file may be writing its pieces right now).
"""
from __future__ import annotations

import secrets
import sqlite3
import time

PIECE_BYTES = 1024 * 1024  # about 2 ms of the writer each
ORPHAN_AGE = 3600.0  # seconds

SCHEMA = """
CREATE TABLE IF NOT EXISTS pieces (blob INTEGER NOT NULL, part INTEGER NOT NULL, written REAL NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (blob, part));
CREATE TABLE IF NOT EXISTS pieced (world TEXT NOT NULL, seq INTEGER NOT NULL, blob INTEGER NOT NULL UNIQUE,
    bytes INTEGER NOT NULL, PRIMARY KEY (world, seq)) WITHOUT ROWID;
"""

# An event's size in a search step: its pieces', if its body is in pieces (`length` of a BLOB reads no body).
SIZE = ("CASE WHEN length(body)>0 THEN length(body) ELSE COALESCE((SELECT bytes FROM pieced d "
        "WHERE d.world=events.world AND d.seq=events.seq), 0) END")
# Whether a pieced event holds the pattern: each piece with the start of the next (as many bytes as the
# needle has, less one), so a match across two pieces is found once. Binds (overlap, pattern).
PIECES_LIKE = ("(length(body)=0 AND EXISTS (SELECT 1 FROM pieced d JOIN pieces p ON p.blob=d.blob "
               "LEFT JOIN pieces q ON q.blob=p.blob AND q.part=p.part+1 "
               "WHERE d.world=events.world AND d.seq=events.seq "
               "AND CAST(p.data || COALESCE(substr(q.data, 1, ?), x'') AS TEXT) LIKE ? ESCAPE '\\'))")


def new_blob() -> int:
    """A name for one body's pieces: random, since several processes may write to one file."""
    return secrets.randbits(62)


def put(db: sqlite3.Connection, blob: int, part: int, data: memoryview) -> None:
    """Write one piece (its own transaction: the connection commits each statement)."""
    db.execute("INSERT INTO pieces (blob, part, written, data) VALUES (?, ?, ?, ?)", (blob, part, time.time(), data))


def name(db: sqlite3.Connection, world: str, seq: int, blob: int, size: int) -> None:
    """Name `blob`'s pieces as the body of `seq` (inside the event's transaction)."""
    db.execute("INSERT INTO pieced (world, seq, blob, bytes) VALUES (?, ?, ?, ?)", (world, seq, blob, size))


def read(db: sqlite3.Connection, world: str, seq: int) -> tuple[bytes, ...]:
    """The pieces of `seq`'s body, in order (joined where they are decoded, off this thread)."""
    return tuple(data for (data,) in db.execute(
        "SELECT p.data FROM pieced d JOIN pieces p ON p.blob=d.blob WHERE d.world=? AND d.seq=? ORDER BY p.part",
        (world, seq)))


def drop_unnamed(db: sqlite3.Connection, blobs: tuple[int, ...] | None = None, age: float = ORPHAN_AGE) -> int:
    """Drop the pieces no event names: of `blobs` whatever their age, or else those older than `age`.
    Returns how many pieces went."""
    unnamed = "blob NOT IN (SELECT blob FROM pieced)"
    if blobs is not None:
        return db.execute(f"DELETE FROM pieces WHERE {unnamed} AND blob IN ({','.join('?' * len(blobs))})",
                          blobs).rowcount
    return db.execute(f"DELETE FROM pieces WHERE {unnamed} AND written<?", (time.time() - age,)).rowcount
