"""Moving a world between logs (SQLite ⇄ Redis, or one Redis to another): export and import.

A log keeps, beside the events, the index state their ops left (open items, claims, tags), and
the ops themselves are not stored. So an export writes each event with the part of that state
it carries: the keys it holds open now and the tags it has; the world's claims, which have no
seq, go in the header. An import appends the events through the ordinary `append_batch`, each
with `Open`/`Tag` ops rebuilt from its line (and the claims with the last event), so the new log
builds the very same projections by its own code path, and every seq comes out the same.

The file is JSON Lines: a header, then one line per event in seq order:

    {"format": "agent-world-export", "version": 1, "world": W, "events": N, "claims": [...]}
    {"seq": 1, "event": {...}, "open": ["world"], "tags": ["audit"]}
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..vocab import WORLD_ID, Event
from .base import Batched, Claim, EventLog, Op, Open, Tag

FORMAT = "agent-world-export"
VERSION = 1
PAGE = 1000  # events read, or appended in one batch, at a time
SNAPSHOT_TRIES = 5


class PortError(Exception):
    """An export or import that cannot be done; the message says why, in one line."""


@dataclass
class IndexState:
    """What a world's ops left behind: open key -> seq, the claims, seq -> tags."""
    open: dict[str, int] = field(default_factory=dict)
    claims: list[str] = field(default_factory=list)
    tags: dict[int, list[str]] = field(default_factory=dict)

    def opened_by(self) -> dict[int, list[str]]:
        by_seq: dict[int, list[str]] = {}
        for key, seq in sorted(self.open.items()):
            by_seq.setdefault(seq, []).append(key)
        return by_seq


async def index_state(log: EventLog, world: str) -> IndexState:
    """The index state of `world` in `log` (a SqliteLog or a RedisLog)."""
    from .redis.log import RedisLog
    from .sqlite import SqliteLog

    if isinstance(log, SqliteLog):
        return await log._read(_sqlite_state, world)  # the reader's thread and connection
    if isinstance(log, RedisLog):
        return await _redis_state(log, world)
    raise PortError(f"cannot read the index of a {type(log).__name__}")


def _sqlite_state(db: sqlite3.Connection, world: str) -> IndexState:
    state = IndexState()
    db.execute("BEGIN")  # one snapshot for the three reads (WAL)
    try:
        state.open = dict(db.execute("SELECT key, seq FROM open_items WHERE world=?", (world,)).fetchall())
        state.claims = sorted(r[0] for r in db.execute("SELECT key FROM claims WHERE world=?", (world,)))
        for tag, seq in db.execute("SELECT tag, seq FROM tags WHERE world=? ORDER BY tag", (world,)):
            state.tags.setdefault(seq, []).append(tag)
    finally:
        db.execute("COMMIT")
    return state


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


async def _redis_state(log: Any, world: str) -> IndexState:
    r = log._r
    state = IndexState()
    state.open = {k: int(v) for k, v in (await r.hgetall(log._key(world, "open"))).items()}
    state.claims = sorted(await r.smembers(log._key(world, "claims")))
    tag_prefix = log._tag_key(world, "")
    # The world's tag sets are found by a SCAN of its own keys: fine for a one-off export.
    async for key in r.scan_iter(match=_glob_escape(tag_prefix) + "*", count=1000):
        tag = key[len(tag_prefix):]
        for seq in await r.zrange(key, 0, -1):
            state.tags.setdefault(int(seq), []).append(tag)
    for tags in state.tags.values():
        tags.sort()
    return state


async def export_lines(log: EventLog, world: str) -> AsyncIterator[str]:
    """The export of `world`, line by line (no newlines). Every index change comes with an append,
    so a world whose last seq did not move while it was read was read consistently: else retry."""
    for _ in range(SNAPSHOT_TRIES):
        last = await log.last_seq(world)
        if last == 0:
            raise PortError(f"no world {world!r} in this storage")
        state = await index_state(log, world)
        events: list[Event] = []
        while len(events) < last:
            page = await log.read(world, after=len(events), limit=min(PAGE, last - len(events)))
            if not page:
                break
            events.extend(page)
        if await log.last_seq(world) == last and len(events) == last:
            break
    else:
        raise PortError(f"world {world!r} kept changing while it was read: stop its agents or retry")
    yield json.dumps({"format": FORMAT, "version": VERSION, "world": world, "events": last,
                      "claims": state.claims}, ensure_ascii=False)
    opened = state.opened_by()
    for event in events:
        seq = event["seq"]
        body = {k: v for k, v in event.items() if k not in ("seq", "world")}
        yield json.dumps({"seq": seq, "event": body, "open": opened.get(seq, []), "tags": state.tags.get(seq, [])},
                         ensure_ascii=False)


@dataclass
class Imported:
    world: str
    events: int
    open: int
    claims: int
    # The allow rules and allow grants the file held (`rule_added`/`grant_added` events): revoked at once
    # unless the import was asked to keep them (`Engine.import_world`).
    allowances: list[Event] = field(default_factory=list)
    allowances_kept: bool = True
    closed: int = 0  # pending requests denied and approved calls answered unrun, where not kept


def _parse(lines: Iterable[str]) -> tuple[dict[str, Any], Iterator[tuple[int, dict[str, Any]]]]:
    numbered = ((n, line) for n, line in enumerate(lines, start=1) if line.strip())
    try:
        _, first = next(numbered)
        header = json.loads(first)
    except StopIteration:
        raise PortError("the file is empty") from None
    except ValueError:
        raise PortError("line 1 is not JSON: not an Agent World export") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise PortError("line 1 is not an Agent World export header")
    if header.get("version") != VERSION:
        raise PortError(f"export version {header.get('version')!r} is not supported (this server reads {VERSION})")
    if not isinstance(header.get("world"), str) or not header["world"]:
        raise PortError("the header names no world")
    if not WORLD_ID.fullmatch(header["world"]):
        # The id names the world's workspace folder: `..` or `/` would put it over the data folder or `/`.
        raise PortError(f"the header's world id {header['world'][:80]!r} is not one this server makes "
                        f"({WORLD_ID.pattern})")
    if not isinstance(header.get("events"), int) or not isinstance(header.get("claims"), list):
        raise PortError("the header lacks its event count or claims")

    def rows() -> Iterator[tuple[int, dict[str, Any]]]:
        for n, line in numbered:
            try:
                row = json.loads(line)
            except ValueError:
                raise PortError(f"line {n} is not JSON") from None
            if not (isinstance(row, dict) and isinstance(row.get("seq"), int) and isinstance(row.get("event"), dict)
                    and isinstance(row.get("open", []), list) and isinstance(row.get("tags", []), list)):
                raise PortError(f"line {n} is not an event line (seq, event, open, tags)")
            yield n, row
    return header, rows()


async def import_lines(log: EventLog, lines: Iterable[str]) -> Imported:
    """Append an export to `log`, into a world of the same id that has no events there yet.

    The whole file is checked before anything is written, so a bad file imports nothing."""
    header, rows = _parse(lines)
    world, total = header["world"], header["events"]
    items: list[Batched] = []
    opened = 0
    for n, row in rows:
        if row["seq"] != len(items) + 1:
            raise PortError(f"line {n} has seq {row['seq']}, expected {len(items) + 1}")
        ops: list[Op] = [Open(str(key)) for key in row.get("open", [])]
        ops += [Tag(str(tag)) for tag in row.get("tags", [])]
        opened += len(row.get("open", []))
        items.append((row["event"], ops))
    if len(items) != total or not items:
        raise PortError(f"the file holds {len(items)} events, its header says {total}")
    claims = [Claim(str(key)) for key in header["claims"]]
    items[-1] = (items[-1][0], [*items[-1][1], *claims])
    if await log.last_seq(world):
        raise PortError(f"world {world!r} already exists here: nothing imported")
    for start in range(0, len(items), PAGE):
        await _append(log, world, items[start:start + PAGE], start + 1)
    return Imported(world, total, opened, len(claims))


async def _append(log: EventLog, world: str, batch: list[Batched], first: int) -> None:
    """Append `batch`, which must land at seqs `first`, `first + 1`, …"""
    if not batch:
        return
    written = await log.append_batch(world, batch)
    if written[0]["seq"] != first:
        raise PortError(f"world {world!r} was written to by someone else during the import "
                        f"(seq {written[0]['seq']} instead of {first}): it is incomplete")
