"""Token usage summed per agent and per world, derived from the log (its one source of truth): the
`usage` an agent's reply carries (docs/protocol.md §3).

A world's log is read once per process, the first time its sums are asked for; from then on every
event the engine handles adds to them, so reading them (the page, /metrics) reads no event.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from ... import vocab
from ...log import EventLog
from ...metrics import Metrics
from ...vocab import Event
from ..hosting.catchup import Handled

logger = logging.getLogger(__name__)
TOKEN_KINDS = ("prompt_tokens", "completion_tokens", "total_tokens")
_PAGE = 1000


@dataclass
class Tally:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    replies: int = 0  # replies that reported their usage

    def add(self, usage: dict[str, Any]) -> None:
        counts = {kind: _count(usage.get(kind)) for kind in TOKEN_KINDS}
        if not counts["total_tokens"]:  # some endpoints leave it out
            counts["total_tokens"] = counts["prompt_tokens"] + counts["completion_tokens"]
        self.prompt_tokens += counts["prompt_tokens"]
        self.completion_tokens += counts["completion_tokens"]
        self.total_tokens += counts["total_tokens"]
        self.replies += 1

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_of(event: Event) -> dict[str, Any] | None:
    """The usage an agent's own reply reports (None for every other event)."""
    usage = event.get("usage")
    if (event.get("kind") == vocab.MESSAGE and event.get("role") == "assistant" and isinstance(usage, dict)
            and event.get("agent") and event.get("sender") == event.get("agent")):
        return usage
    return None


@dataclass
class _Book:
    handled: Handled | None = None  # None until the log was read once
    agents: dict[str, Tally] = field(default_factory=dict)
    deleted: bool = False
    heard: list[Event] = field(default_factory=list)  # events observed while the log was being read
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _sums(book: _Book) -> dict[str, Any]:
    total = Tally()
    for tally in book.agents.values():
        for kind in TOKEN_KINDS:
            setattr(total, kind, getattr(total, kind) + getattr(tally, kind))
        total.replies += tally.replies
    return {"world": total.as_dict(), "agents": {name: t.as_dict() for name, t in sorted(book.agents.items())}}


class Usage:
    """Sums kept current from every event the engine handles (`Metrics.observe`), after one read of a
    world's log the first time it is asked for: a read of the sums, or a scrape, reads no event."""

    def __init__(self, log: EventLog, metrics: Metrics) -> None:
        self.log = log
        self.metrics = metrics
        self._books: dict[str, _Book] = {}
        self._all = False  # every world of the log was summed once (see refresh_metrics)
        self._loading: set[asyncio.Task[_Book]] = set()  # sums of new worlds being read
        metrics.watchers.append(self.observe)

    async def of(self, world: str) -> dict[str, Any]:
        """{"world": totals, "agents": {name: totals}} (agents removed since included)."""
        return _sums(await self._loaded(world))

    def known(self, world: str, event: Event | None = None) -> dict[str, Any] | None:
        """What `of` says, without waiting: None while the world's log was not read in this process.
        `event` (a reply being shown) is counted in if the sums have not heard of it yet."""
        book = self._books.get(world)
        if book is None or book.handled is None:
            return None
        if event is None or (usage := usage_of(event)) is None or event["seq"] in book.handled or book.deleted:
            return _sums(book)
        agents = {name: Tally(**t.as_dict()) for name, t in book.agents.items()}
        agents.setdefault(str(event["agent"]), Tally()).add(usage)
        return _sums(_Book(agents=agents))

    async def refresh_metrics(self) -> None:
        """Sum every world from its log at the first scrape; from then on a scrape reads nothing (worlds
        created later are summed as soon as their first event is heard)."""
        if self._all:
            return
        for world in await self.log.worlds():
            await self._loaded(world)
        self._all = True

    def observe(self, world: str, event: Event) -> None:
        """Called for every event the engine handles (by the bus or caught up on from the log)."""
        book = self._books.get(world)
        if not isinstance(event.get("seq"), int):
            return  # not a persisted event: never breaks the listener that calls this
        if book is None:
            if not self._all:
                return  # never asked for: the first read sums it from the log
            book = self._books[world] = _Book()
            task = asyncio.create_task(self._loaded(world), name=f"usage-{world}")
            self._loading.add(task)
            task.add_done_callback(self._load_done)
        if book.handled is None:
            book.heard.append(event)
        elif book.handled.add(event["seq"]):
            self._count(world, book, event)

    def _load_done(self, task: asyncio.Task[_Book]) -> None:
        self._loading.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # The world is summed at its next read instead (the page, the API): its book is still unread.
            logger.warning("could not sum the usage of a world: %s: %s", type(exc).__name__, exc)

    async def _loaded(self, world: str) -> _Book:
        book = self._books.setdefault(world, _Book())
        async with book.lock:  # one read of the log per world, however many ask at once
            if book.handled is not None:
                return book
            handled, after = Handled(), 0
            while True:
                events = await self.log.read(world, after, _PAGE)
                for event in events:
                    if handled.add(event["seq"]):
                        self._count(world, book, event)
                if len(events) < _PAGE:
                    break
                after = events[-1]["seq"]
            for event in book.heard:  # what arrived meanwhile, each event counted once
                if handled.add(event["seq"]):
                    self._count(world, book, event)
            book.heard.clear()
            book.handled = handled
        return book

    def _count(self, world: str, book: _Book, event: Event) -> None:
        if event.get("kind") == vocab.WORLD_DELETED:
            book.deleted = True
            for agent in book.agents:
                for kind in TOKEN_KINDS:
                    try:
                        self.metrics.tokens.remove(world, agent, kind.removesuffix("_tokens"))
                    except KeyError:  # never published
                        pass
            book.agents.clear()
        elif (usage := usage_of(event)) is not None and not book.deleted:
            agent = str(event["agent"])
            tally = book.agents.setdefault(agent, Tally())
            tally.add(usage)
            for kind in TOKEN_KINDS:
                self.metrics.tokens.labels(world, agent, kind.removesuffix("_tokens")).set(getattr(tally, kind))
