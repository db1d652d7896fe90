"""The engine's one door to the log and the bus: append, then publish the very same event."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from .. import offload
from ..bus import Bus
from ..log import Batched, EventLog, Op
from ..log.codec import encode
from ..vocab import Event, now_iso
from .public import public_off_loop


def channel(world: str) -> str:
    """The bus channel of a world: persisted events and live frames (chunks, status, presence)."""
    return f"world:{world}"


def frame_text(frame: dict[str, Any]) -> str:
    """A frame as sent on the bus and to every client: compact JSON, serialized once."""
    return encode(frame)


Observer = Callable[[str, Event], None]
logger = logging.getLogger(__name__)
_MAX_OWN = 10_000  # seqs remembered per world (see Store._own)




async def _event_frame(event: Event) -> str:
    """A stored event's bus frame, as clients may see it (a large one redacted and encoded off the loop:
    encoding a 16 MiB result held the loop for 36 ms)."""
    frame = {"type": "event", "event": await public_off_loop(event)}
    heavy = offload.is_large(event, offload.HEAVY_JSON)
    return await offload.run(partial(encode, frame)) if heavy else frame_text(frame)


class Store:
    def __init__(self, log: EventLog, bus: Bus) -> None:
        self.log = log
        self.bus = bus
        self.observers: list[Observer] = []  # told of every event appended here, before anyone reads on
        # seqs appended here that the engine's listener has not heard back yet: observed once, not twice
        self._own: dict[str, set[int]] = {}
        # Each world's latest publish: the next one waits for it, so that events go out in the order
        # stored even when a large one takes a while to redact (a reader would see a gap, and fill it
        # from the log by redacting that same event again).
        self._publishing: dict[str, asyncio.Future[None]] = {}

    async def append(self, world: str, event: Event, ops: Sequence[Op] = ()) -> Event:
        """Persist `event` (raising `Conflict` when `ops` disagree), then publish it to the world."""
        return (await self.append_batch(world, [(event, ops)]))[0]

    async def append_batch(self, world: str, items: Sequence[Batched],
                           on_stored: Callable[[list[Event]], None] | None = None) -> list[Event]:
        """Persist several events at once, all or nothing (see `EventLog.append_batch`), then publish them
        as clients may see them (`public`). `on_stored` is called with them once they are stored, before the
        publish: what follows from the write (a tool's run) starts a round trip earlier, and what it
        publishes goes out after them."""
        ts = now_iso()  # one clock reading for the batch: its events are written at one instant
        for event, _ in items:
            event.setdefault("ts", ts)
        try:
            stored = await self.log.append_batch(world, items)
        except Exception as exc:
            if self.log.may_have_stored(exc):  # e.g. Redis timed out after the write: every reader looks
                self.bus.missed(channel(world))
            raise
        if self.observers:
            own = self._own.setdefault(world, set())
            if len(own) > _MAX_OWN:  # nobody listens (the CLI), or the bus lost them: observing twice is harmless
                own.clear()
            own.update(event["seq"] for event in stored)
            for event in stored:
                for observe in self.observers:
                    observe(world, event)
        if on_stored is not None:
            on_stored(stored)
        name = channel(world)
        before, mine = self._publishing.get(world), asyncio.get_running_loop().create_future()
        self._publishing[world] = mine
        mine.add_done_callback(lambda _: self._publishing.pop(world) if self._publishing.get(world) is mine else None)
        try:
            texts = [await _event_frame(event) for event in stored]
            if before is not None:
                await asyncio.wait([before])
            for event, text in zip(stored, texts, strict=True):
                await self._publish(world, name, event, text)
        except BaseException:
            self.bus.missed(name)  # stored, and perhaps not published: every reader reads it from the log
            raise
        finally:
            # The next publish goes after this one's, and after the one before (a cancelled wait for it
            # must not let the next overtake it).
            if before is None or before.done():
                mine.set_result(None)
            else:
                before.add_done_callback(lambda _: mine.set_result(None))
        return stored

    async def _publish(self, world: str, name: str, event: Event, text: str) -> None:
        try:
            await self.bus.publish(name, text)
        except Exception as exc:
            # Stored all the same: the caller goes on (a decision's call is launched), this process's
            # readers get it here (it wakes the agents; every reader drops an event it has, by seq),
            # and every process's readers are told of a gap once the bus works again: they read it
            # from the log (an agent hosted elsewhere would otherwise never hear of a message).
            logger.warning("event %s of %s stored but not published: %s: %s", event["seq"], world,
                           type(exc).__name__, exc)
            self.bus.deliver_here(name, text)
            self.bus.missed(name)

    def observed_here(self, world: str, seq: int) -> bool:
        """Whether the event `seq` was appended (and so observed) here; each is answered True once."""
        own = self._own.get(world)
        if own is None or seq not in own:
            return False
        own.discard(seq)
        return True

    def last_own(self, world: str) -> int:
        """The highest seq appended here that the engine's listener has not heard back yet (0 for none)."""
        return max(self._own.get(world) or (0,))

    def lost_after(self, world: str, end: int, upto: int) -> bool:
        """The log of `world` ends at `end`: forget the seqs up to `upto` (`last_own` before `end` was read: a
        later one may be missing from that read) appended here after it (the storage lost those events, and
        new ones take their seqs). True if there was any."""
        own = self._own.get(world, set())
        lost = {seq for seq in own if end < seq <= upto}
        own -= lost
        return bool(lost)

    async def publish(self, world: str, frame: dict[str, Any]) -> None:
        """A live frame that is not persisted (a chunk, a status)."""
        await self.bus.publish(channel(world), frame_text(frame))
