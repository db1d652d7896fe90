"""A pull-style bus: a tiny `Backend` moves messages between processes; `Bus` fans them out locally.

Messages are JSON text, serialized once by the publisher, so every subscriber (and every
WebSocket) gets the very same string. Each subscriber has a bounded queue: one that falls
behind is cut off with `Overflow` instead of slowing anyone else down.

Delivery between processes is at-most-once: while a backend's connection is down, what others
publish is lost. So a subscriber is told, in order with its messages, by a `Gap` from `get()`:
`Gap(down=True)` when the connection was lost, `Gap(down=False)` once it is back and subscribed
again. After the latter, whatever was missed is in the event log: catch up from there. A publisher
whose message the backend refused says so with `missed(channel)`: once the backend takes that notice,
every process's subscribers of the channel get the same `Gap(down=False)`.
"""
from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

logger = logging.getLogger(__name__)


class Overflow(Exception):
    """The subscriber fell more than its queue size behind and was cut off."""


MISSED = '{"type":"missed"}'  # a notice on a channel: a message published there may have been lost (`Bus.missed`)
RETRY_FIRST, RETRY_MAX = 0.5, 5.0  # seconds between two tries of a `missed` notice: doubling up to the max


class Gap(Exception):
    """Messages may be missing: the bus lost its connection (`down`), or got it back (not `down`)."""

    def __init__(self, channel: str = "", down: bool = False) -> None:
        super().__init__(f"{channel or 'bus'}: {'connection lost' if down else 'reconnected; messages may be missing'}")
        self.channel = channel
        self.down = down


class Backend(abc.ABC):
    """Moves (channel, message) pairs between processes."""

    # True for a backend that stays inside this process: the Bus hands what is published to its
    # subscribers at once, instead of a wake-up of its pump later (one loop turn on every live frame).
    in_process = False

    async def connect(self) -> None: ...  # noqa: B027 (optional hooks: most backends need nothing here)
    async def disconnect(self) -> None: ...  # noqa: B027

    @abc.abstractmethod
    async def subscribe(self, channel: str) -> None: ...

    @abc.abstractmethod
    async def unsubscribe(self, channel: str) -> None: ...

    @abc.abstractmethod
    async def publish(self, channel: str, message: str) -> None: ...

    @abc.abstractmethod
    async def next_published(self) -> tuple[str, str] | Gap:
        """Wait for the next message on any subscribed channel, or a `Gap` that concerns them all."""


_CUT = object()  # queued to a subscriber that overflowed


class Subscription:
    """One subscriber's bounded queue on one channel; `at_delivery`, if given, is called with each message
    as it is handed over, before anything the bus hands over after it (what must take effect at once)."""

    def __init__(self, channel: str, maxsize: int, at_delivery: Callable[[str], None] | None = None) -> None:
        self.channel = channel
        self._queue: asyncio.Queue[object] = asyncio.Queue()  # bounded by `_offer`
        self._maxsize = maxsize
        self._at_delivery = at_delivery
        self.overflowed = False

    def _signal(self, gap: Gap) -> None:
        if not self.overflowed:  # one that overflowed is cut off already: it starts over anyway
            self._queue.put_nowait(Gap(self.channel, gap.down))

    def _offer(self, message: str) -> None:
        if self._at_delivery is not None:
            self._at_delivery(message)
        if self.overflowed:
            return
        if self._queue.qsize() >= self._maxsize:
            self.overflowed = True
            self._queue.put_nowait(_CUT)
            return
        self._queue.put_nowait(message)

    def pending(self) -> int:
        """Messages queued, not yet taken."""
        return self._queue.qsize()

    async def get(self) -> str:
        """The next message; raises `Overflow` (cut off) or `Gap` (see the module's doc)."""
        return self._unwrap(await self._queue.get())

    def get_nowait(self) -> str | None:
        """The next queued message, or None when the queue is empty."""
        try:
            item = self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None
        return self._unwrap(item)

    def _unwrap(self, item: object) -> str:
        if item is _CUT:
            raise Overflow(self.channel)
        if isinstance(item, Gap):
            raise item
        return item  # type: ignore[return-value]

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> str:
        return await self.get()


class Bus:
    """Fan-out, written once above any backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._subscribers: dict[str, set[Subscription]] = {}
        self._joining: dict[str, int] = {}  # channel -> subscribers waiting on the backend's subscribe
        self._reader: asyncio.Task[None] | None = None
        self._telling: dict[str, asyncio.Task[None]] = {}  # channel -> its `missed` notice, until the backend takes it
        self._again: set[str] = set()  # channels missed again while their notice was on its way: one more goes

    async def connect(self) -> None:
        await self.backend.connect()
        self._reader = asyncio.create_task(self._pump(), name="bus-pump")

    async def disconnect(self) -> None:
        telling = list(self._telling.values())
        for task in telling:
            task.cancel()
        await asyncio.gather(*telling, return_exceptions=True)
        if self._reader:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self.backend.disconnect()

    async def publish(self, channel: str, message: str) -> None:
        await self.backend.publish(channel, message)
        if self.backend.in_process:
            self._deliver(channel, message)

    def deliver_here(self, channel: str, message: str) -> None:
        """Hand `message` to this process's subscribers only: one the backend may not have carried.
        It may come back from the backend too, so only for messages whose readers drop copies."""
        self._deliver(channel, message)

    def missed(self, channel: str) -> None:
        """A message for `channel` was not carried (its publish failed; what it said is stored elsewhere,
        e.g. in the event log): tell every process's subscribers of the channel, as a `Gap(down=False)`,
        so that each catches up from there. Tried in the background until the backend takes it (one
        notice per channel at a time: a gap covers every message before it)."""
        if channel in self._telling:
            # The notice may be on its way already (others read the log on it, maybe before this message's
            # event was stored): one more goes after it, unless its next try covers this one.
            self._again.add(channel)
        else:
            self._telling[channel] = asyncio.create_task(self._tell_missed(channel), name=f"bus-missed-{channel}")

    async def _tell_missed(self, channel: str) -> None:
        delay = RETRY_FIRST
        try:
            while True:
                self._again.discard(channel)  # what was missed before this try, this try tells
                try:
                    await self.publish(channel, MISSED)
                except Exception as exc:
                    logger.warning("could not tell %s of a missed message (%s): trying again in %g s",
                                   channel, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(RETRY_MAX, delay * 2)
                    continue
                # At most one notice per channel every RETRY_FIRST seconds: each makes every reader of the
                # world catch up from the log (a snapshot per socket), so a run of timed-out writes must not
                # turn into a storm of them. What is missed meanwhile goes in one more notice after it.
                await asyncio.sleep(RETRY_FIRST)
                if channel not in self._again:
                    return
                delay = RETRY_FIRST
        finally:
            self._telling.pop(channel, None)
            self._again.discard(channel)

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str, maxsize: int = 1000,
                        at_delivery: Callable[[str], None] | None = None) -> AsyncIterator[Subscription]:
        sub = Subscription(channel, maxsize, at_delivery)
        subs = self._subscribers.setdefault(channel, set())
        try:
            if not subs:
                # Counted while the backend subscribes: one cancelled meanwhile unsubscribes the channel
                # only when no other subscriber is on its way in, or in.
                self._joining[channel] = self._joining.get(channel, 0) + 1
                try:
                    await self.backend.subscribe(channel)
                finally:
                    self._joining[channel] -= 1
                    if not self._joining[channel]:
                        del self._joining[channel]
            subs.add(sub)
            yield sub
        finally:
            subs.discard(sub)
            if not subs and channel not in self._joining and self._subscribers.get(channel) is subs:
                del self._subscribers[channel]
                await self.backend.unsubscribe(channel)

    def subscriber_count(self, channel: str) -> int:
        return len(self._subscribers.get(channel, ()))

    async def _pump(self) -> None:
        while True:
            try:
                item = await self.backend.next_published()
            except asyncio.CancelledError:
                raise
            except Exception:  # a backend hiccup must not end fan-out; the backend reconnects
                logger.exception("bus backend failed; retrying")
                await asyncio.sleep(0.5)
                continue
            if isinstance(item, Gap):
                for subs in tuple(self._subscribers.values()):
                    for sub in tuple(subs):
                        sub._signal(item)
                continue
            self._deliver(*item)

    def _deliver(self, channel: str, message: str) -> None:
        if message == MISSED:
            for sub in tuple(self._subscribers.get(channel, ())):
                sub._signal(Gap(channel))
            return
        for sub in tuple(self._subscribers.get(channel, ())):
            try:
                sub._offer(message)
            except Exception:  # one subscriber's bug must not reach the publisher (its write is done) nor the others
                logger.exception("bus subscriber on %s failed", channel)
