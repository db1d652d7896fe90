"""The SQLite log's tables, and how each of an append's operations (Open, Close, Claim, Tag, Fence)
changes them within its transaction (server/log/sqlite.py)."""
from __future__ import annotations

import sqlite3

from ..vocab import WORK_PREFIXES
from . import sqlite_pieces as pieces
from .base import Claim, Close, Conflict, Fence, Op, Open, Tag

MAX_SEQ = 2**63 - 1  # SQLite's largest integer: a Close without a seq bound

# An event's body is its compact JSON, written as a BLOB (files from before hold TEXT: both decode), or
# empty when it is stored in pieces.
SCHEMA = pieces.SCHEMA + """
CREATE TABLE IF NOT EXISTS events (world TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (world, seq));
CREATE TABLE IF NOT EXISTS heads (world TEXT PRIMARY KEY, last_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS open_items (world TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (world, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS claims (world TEXT NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (world, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS open_items_by_key ON open_items (key, world);
CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tags (world TEXT NOT NULL, tag TEXT NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (world, tag, seq)) WITHOUT ROWID;
"""


def lease_name(name: str, world: str | None) -> str:
    """The row of a lease: a world's leases are named apart from every other world's."""
    return name if world is None else f"{world}\x1f{name}"


def prefix_end(prefix: str) -> str:
    """The smallest string greater than every string that starts with `prefix`."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\U0010ffff"


WORK_RANGES = [bound for prefix in WORK_PREFIXES for bound in (prefix, prefix_end(prefix))]
WORK_WHERE = " OR ".join(["(key>=? AND key<?)"] * len(WORK_PREFIXES))


def apply(db: sqlite3.Connection, world: str, seq: int, op: Op) -> None:
    """Apply one of an append's operations to the index tables, inside its transaction; a failed condition
    raises Conflict (and the append writes nothing)."""
    if isinstance(op, Open):
        if op.new and db.execute("SELECT 1 FROM open_items WHERE world=? AND key=?",
                                 (world, op.key)).fetchone():
            raise Conflict(op.key, "open")
        db.execute("INSERT OR REPLACE INTO open_items (world, key, seq) VALUES (?, ?, ?)",
                   (world, op.key, seq))
    elif isinstance(op, Close):
        up_to = MAX_SEQ if op.unless_reopened_after is None else op.unless_reopened_after
        cur = db.execute("DELETE FROM open_items WHERE world=? AND key=? AND seq<=?", (world, op.key, up_to))
        # Nothing deleted: a conflict, unless the key is open and was only left so (reopened since).
        if op.must_exist and cur.rowcount == 0 and (up_to == MAX_SEQ or not db.execute(
                "SELECT 1 FROM open_items WHERE world=? AND key=?", (world, op.key)).fetchone()):
            raise Conflict(op.key, "closed")
    elif isinstance(op, Claim):
        try:
            db.execute("INSERT INTO claims (world, key) VALUES (?, ?)", (world, op.key))
        except sqlite3.IntegrityError:
            raise Conflict(op.key, "claimed") from None
    elif isinstance(op, Tag):
        db.execute("INSERT OR IGNORE INTO tags (world, tag, seq) VALUES (?, ?, ?)",
                   (world, op.tag, seq))
    elif isinstance(op, Fence):
        row = db.execute("SELECT token FROM leases WHERE name=?", (lease_name(op.lease, world),)).fetchone()
        if row is None or row[0] != op.token:
            raise Conflict(op.lease, "fenced")
    else:  # pragma: no cover - a programming error
        raise TypeError(f"unknown op {op!r}")
