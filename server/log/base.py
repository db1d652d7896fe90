"""The event log interface.

A world's log is an append-only list of events numbered by `seq` (1, 2, 3, … with no gaps).
Each append may carry *index operations* that the log applies atomically with the append.
They keep the indexed projections that let every lookup avoid scanning the log:

- `Open(key)` / `Close(key)`: the set of *open items* (pending approvals, calls awaiting a
  result, agent turns owed, always-rules, …), each pointing at the event that opened it.
  `Open(key, new=True)` fails if the key is already open; `Close(key, must_exist=True)` fails
  if it is not, and `Close(key, unless_reopened_after=seq)` leaves it open when an event after `seq`
  opened it. That conditional append is how "the first decision wins" is decided — by the
  log, in every process, never by a check in one process's memory.
- `Claim(key)`: a permanent unique key ("this call id was issued", "this call was started").
- `Tag(tag)`: adds the event to an indexed subset (an agent's memory of a chat, the audit trail).
- `Fence(lease, token)`: the append is refused unless the world's lease `lease` is still at
  `token`, so a process that lost a lease (paused, cut off) cannot finish what its successor took over.

An append whose conditions fail raises `Conflict` and changes nothing.

The *work index* lists the worlds with an open item that is work (`vocab.WORK_PREFIXES`: a turn owed, a
request pending, a call awaiting its result): what every process hosts, read at start-up instead of
every world. A world enters it atomically with (or before) the append that opens its first work item,
and leaves it only through `unlist_if_idle`, which a concurrent append opening work never loses to.

Leases are the other thing processes must agree on: which process runs an agent's turns, and
whether the process that started a tool call is still alive. A lease is held by one holder
until it expires or is released. Each time it changes hands its *fencing token* grows (a counter
kept for good, across expiries and releases): `lease()` returns it, and writes made under the
lease carry it in a `Fence`. A lease given a `world` lives with that world's data (one Redis
Cluster slot), which a `Fence` in an append to that world needs.
"""
from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..vocab import WORK_PREFIXES, Event
from .failures import StorageError
from .search import SEARCH_CHUNK, SEARCH_STEP_BYTES, SEARCH_WINDOW, matches, needle


@dataclass(frozen=True)
class Open:
    key: str
    new: bool = True


@dataclass(frozen=True)
class Close:
    key: str
    must_exist: bool = True
    # Left open (no conflict) when the key was opened again by an event after this seq: a turn answered
    # from what was read up to it, and owed again for a message written since, stays owed.
    unless_reopened_after: int | None = None


@dataclass(frozen=True)
class Claim:
    key: str


@dataclass(frozen=True)
class Tag:
    tag: str


@dataclass(frozen=True)
class Fence:
    """Refuse the append (`Conflict`, reason "fenced") unless the world's lease `lease` is at `token`."""
    lease: str
    token: int


Op = Open | Close | Claim | Tag | Fence
Batched = tuple[Event, Sequence[Op]]  # one event of an `append_batch`, with its ops


def stored_body(world: str, event: Event) -> Event:
    """A copy of `event` as a log stores it: with its world, without a `seq` (that comes on reading)."""
    body = dict(event)  # a C-level copy: several times faster than filtering key by key
    body.pop("seq", None)
    body["world"] = world
    return body


def opens_work(ops: Sequence[Op]) -> bool:
    """Whether `ops` open an item that is work (see `vocab.WORK_PREFIXES`)."""
    return any(isinstance(op, Open) and op.key.startswith(WORK_PREFIXES) for op in ops)


class Conflict(Exception):
    """An append's condition failed; `key` says which one. Nothing was written. (Not a `StorageError`: the
    storage worked, and said no.)"""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{reason}: {key}")
        self.key = key
        self.reason = reason  # "open" (already open), "closed" (not open), "claimed", "fenced" (stale lease)


class EventLog(abc.ABC):
    """Durable, per-world, append-only event storage with atomic index operations.

    Every operation raises `StorageError` (from the storage's own error) when the storage fails."""

    def may_have_stored(self, exc: BaseException) -> bool:
        """Whether an append that raised `exc` may have been stored all the same (its answer was lost)."""
        return isinstance(exc, StorageError) and exc.may_have_stored

    async def append(self, world: str, event: Event, ops: Sequence[Op] = ()) -> Event:
        """Persist `event` with the next `seq` and apply `ops` atomically; return it with its `seq`."""
        return (await self.append_batch(world, [(event, ops)]))[0]

    @abc.abstractmethod
    async def append_batch(self, world: str, items: Sequence[Batched]) -> list[Event]:
        """Append several events at once, each with its ops, all or nothing, with consecutive seqs.

        Each item's ops see the effects of the items before it (and apply with that item's seq).
        """

    @abc.abstractmethod
    async def read(self, world: str, after: int = 0, limit: int = 1000) -> list[Event]:
        """Events with `seq > after`, in order, at most `limit`."""

    @abc.abstractmethod
    async def read_tagged(self, world: str, tags: Sequence[str], after: int = 0,
                          limit: int | None = None, newest: bool = False) -> list[Event]:
        """Events carrying any of `tags` with `seq > after`, in `seq` order.

        With `newest=True` and a `limit`, the *last* `limit` such events (still in `seq` order).
        """

    async def get_open(self, world: str, key: str) -> Event | None:
        """The event that opened `key`, if `key` is open."""
        return (await self.get_open_many(world, [key])).get(key)

    search_chunk = SEARCH_CHUNK  # events one `search_between` looks through at most
    search_step_bytes = SEARCH_STEP_BYTES  # and bytes of stored events (at least one event)

    async def search(self, world: str, query: str, *, chat: str | None = None, limit: int = 50,
                     window: int = SEARCH_WINDOW,
                     shown: Callable[[Event], Awaitable[Event]] | None = None) -> list[Event]:
        """The messages (of `chat`, when given) among the newest `window` events whose text or tool calls
        hold `query`, newest first, at most `limit` (see server/log/search.py). With `shown`, each candidate
        is turned into what the caller hands out first, and the match is tested on that: only what the
        caller will show counts toward `limit` (a hit only in a value `shown` hides is no hit)."""
        wanted, found = needle(query), list[Event]()
        high = await self.last_seq(world)
        floor = max(0, high - window)
        while high > floor and len(found) < limit:
            hits, high = await self.search_between(world, wanted, max(floor, high - self.search_chunk), high)
            for event in hits:
                if chat is not None and event.get("chat") != chat:
                    continue
                seen = event if shown is None else await shown(event)
                if matches(seen, query, chat):
                    found.append(seen)
                    if len(found) == limit:
                        break
        return found

    @abc.abstractmethod
    async def search_between(self, world: str, needle: str, low: int, high: int) -> tuple[list[Event], int]:
        """The events with `reached < seq <= high` whose stored JSON holds `needle` (lowercase: ASCII letters
        match either case), newest first, and `reached`: the step stops, going down from `high`, after
        `search_chunk` events or `search_step_bytes` bytes of them (at least one event), or at `low`. The
        storage does the looking: only those events come back."""

    @abc.abstractmethod
    async def get_open_many(self, world: str, keys: Sequence[str]) -> dict[str, Event]:
        """The events that opened those of `keys` that are open, by key, in one round trip."""

    @abc.abstractmethod
    async def list_open(self, world: str, prefix: str) -> list[Event]:
        """The opening events of every open key starting with `prefix`, oldest first."""

    @abc.abstractmethod
    async def is_claimed(self, world: str, key: str) -> bool:
        """Whether `key` was ever claimed in `world`."""

    @abc.abstractmethod
    async def last_seq(self, world: str) -> int:
        """The highest `seq` in `world` (0 when empty)."""

    @abc.abstractmethod
    async def worlds(self, after: str = "", limit: int | None = None) -> list[str]:
        """World ids that have at least one event, in id order: those after `after`, at most `limit`
        (a page read from an index, not the whole list)."""

    @abc.abstractmethod
    async def worlds_with_work(self) -> list[str]:
        """Every world in the work index, in id order."""

    @abc.abstractmethod
    async def unlist_if_idle(self, world: str) -> bool:
        """Take `world` out of the work index unless it has open work: True when it is out. An append
        opening work concurrently (in any process) either makes this answer False or puts the world back."""

    # Called with a world that an append just put into the work index (not for every append: only
    # when it was out), so that other processes may host it (the engine announces it on the bus).
    on_listed: Callable[[str], None] | None = None

    @abc.abstractmethod
    async def lease(self, name: str, holder: str, ttl: float, *, world: str | None = None,
                    mark: bool = False) -> int:
        """Take `name` for `holder` for `ttl` seconds, or renew it: its fencing token (1, 2, …, the
        same while renewed, larger after each change of hands); 0 while another holder has it.

        A `mark` is a lease nothing is fenced by (a process's heartbeat, a tool's `began`): its token
        lives only as long as it does (the next one starts at 1 again), so that one per tool call does
        not leave a counter behind for good."""

    @abc.abstractmethod
    async def release(self, name: str, holder: str, *, world: str | None = None, mark: bool = False) -> None:
        """Give `name` up, if `holder` holds it (its fencing token is kept, unless it is a `mark`)."""

    @abc.abstractmethod
    async def lease_holder(self, name: str, *, world: str | None = None) -> str | None:
        """Who holds `name` now (None once it expired or was released)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and files."""
