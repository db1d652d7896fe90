"""What a hosted world hears: its bus channel followed from any process, and what the bus missed caught up
on from the log, each event handled once; `_on_frame` is the one place where the engine's parts observe
what was written (approvals' deadlines, agents added or removed, settings, MCP sign-ins)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from ... import offload, vocab
from ...aio import keep
from ...bus import Gap, Overflow, Subscription
from ...log.codec import decode
from ...log.failures import StorageError
from ...vocab import Event
from ..public import public_off_loop
from ..services import Services
from ..store import channel
from ..world.tools import WorldTools
from .catchup import Handled

if TYPE_CHECKING:
    from .hosted import Hosted

logger = logging.getLogger(__name__)
# Frames are compact JSON written by one encoder, so their type leads: no need to parse them all.
_IGNORED_FRAMES = ('{"type":"chunk"', '{"type":"presence"')
_STATUS_FRAME = '{"type":"status"'


class Listening:
    """A part of `Hosting` (a mixin): the attributes below, and the methods declared for the type checker,
    are Hosting's own."""

    services: Services
    world_tools: WorldTools
    hosted: dict[str, Hosted]
    heard: list[Callable[[str, Event], None]]
    _retrying: set[asyncio.Task[None]]

    if TYPE_CHECKING:
        def _touch(self, world: str, hosted: Hosted) -> None: ...
        def _wake_runners(self, world: str, event: Event, holders: bool | None = None) -> None: ...
        def _spawn(self, job: Coroutine[Any, Any, None], name: str) -> None: ...
        def _ensure_runner(self, world: str, agent: str) -> None: ...
        def wake_all(self, world: str) -> None: ...
        async def unhost(self, world: str) -> None: ...
        async def host_new(self, news: list[str] | None) -> None: ...

    async def _listen(self, world: str, ready: asyncio.Event) -> None:
        """Follow the world's bus channel: wake runners on every event, from any process. What the bus
        missed (a reconnect, an overflow) is caught up on from the log, each event handled once."""
        offload.working_for(world)  # (a large event's JSON in the workers)
        store = self.services.store
        handled: Handled | None = None
        while True:
            try:
                if handled is None:
                    handled = Handled(await store.log.last_seq(world))
                async with store.bus.subscribe(channel(world), maxsize=100_000) as sub:
                    await self._catch_up(world, handled)
                    self._hearing(world, True)  # from here on every change of it reaches this process
                    try:
                        ready.set()
                        self.wake_all(world)  # anything missed while (re)subscribing is in the log
                        await self._follow(world, sub, handled)
                    finally:  # (an overflow, trouble, a stop)
                        self._hearing(world, False)
            except Overflow:
                logger.warning("engine fell behind on %s; resubscribing", world)
            except Exception as exc:  # e.g. the storage is down: catch up once it answers again
                logger.warning("engine lost track of %s (%s: %s); catching up in 1 s", world, type(exc).__name__, exc)
                ready.set()  # host() goes on (and meets the same trouble) rather than hang
                await asyncio.sleep(1.0)

    async def _follow(self, world: str, sub: Subscription, handled: Handled) -> None:
        """Handle each frame of the world's channel as it comes (until the subscription fails)."""
        exclusive = self.services.leases.exclusive
        while True:
            try:
                text = await sub.get()
            except Gap as gap:
                if not gap.down:  # subscribed again: what the bus lost is in the log
                    await self._catch_up(world, handled)
                    self.wake_all(world)
                continue
            if text.startswith(_IGNORED_FRAMES):  # streamed text: nothing for the engine
                continue
            if exclusive and text.startswith(_STATUS_FRAME):
                continue  # the only process: every status was set here, on this board
            # A large frame (a 16 MiB tool result) is parsed in a worker: 60 ms of the loop here.
            heavy = len(text) > offload.HEAVY_JSON
            frame = await offload.run(partial(decode, text)) if heavy else decode(text)
            if frame.get("type") == "event" and frame["event"]["seq"] in handled:
                continue  # caught up on from the log already
            await self._handle(world, frame, handled)
            if handled.holey:
                await self._catch_up(world, handled)

    def _hearing(self, world: str, on: bool) -> None:
        """The listener of `world` hears every change of it from now on, or no longer: then what is
        memoized of it goes (nothing would drop it), and nothing is memoized until it hears again."""
        hosted = self.hosted.get(world)
        if hosted is not None:
            hosted.subscribed = on
        if not on:
            self.services.worlds.forget(world)

    async def _catch_up(self, world: str, handled: Handled) -> None:
        """Handle the logged events of `world` above `handled.floor` that were not handled yet."""
        store = self.services.store
        own = store.last_own(world)
        end = await store.log.last_seq(world)
        # e.g. Redis came back from an older snapshot: new events take the seqs of those it lost (both
        # forget them: this process's writes the listener has not heard back yet count too)
        if handled.lost_after(end) | store.lost_after(world, end, own):
            logger.warning("the storage lost the events of %s after seq %d", world, end)
            self.services.worlds.forget(world)  # the world's configuration may have changed back
            hosted = self.hosted.get(world)
            if hosted is not None:
                for runner in hosted.runners.values():
                    runner.storage_lost()
                # The events written since the loss took seqs handled already, so none is handled below:
                # an agent added, a request asked, new settings. Host the world again from the log, in
                # the background (host() waits for this very listener).
                hosted.whole = False
                keep(self._retrying, self.host_new([world]), f"host-again-{world}")
        after = handled.floor
        while after < end:
            events = await store.log.read(world, after, 1000)
            for event in events:
                if event["seq"] not in handled:
                    await self._handle(world, {"type": "event", "event": await public_off_loop(event)}, handled)
            if len(events) < 1000:
                return
            after = events[-1]["seq"]

    async def _handle(self, world: str, frame: dict[str, Any], handled: Handled) -> None:
        """`_on_frame`, then its event is marked handled; not when the storage failed midway (reading a
        WORLD_UPDATED's new settings): the listener's catch-up from the log handles it again."""
        try:
            await self._on_frame(world, frame)
        except StorageError:
            raise
        except Exception:
            self._mark(frame, handled)  # a bug: the event is not tried again for ever
            raise
        self._mark(frame, handled)

    @staticmethod
    def _mark(frame: dict[str, Any], handled: Handled) -> None:
        if frame.get("type") == "event":
            handled.add(frame["event"]["seq"])

    async def _on_frame(self, world: str, frame: dict[str, Any]) -> None:
        """The one place where the engine's parts observe what was written (by any process)."""
        services = self.services
        if frame.get("type") == "status":
            services.status.observe(world, frame)
            return
        if frame.get("type") == "mcp_state":
            self.world_tools.observe(world, frame)
            return
        if frame.get("type") != "event":
            return
        event = frame["event"]
        kind = event.get("kind")
        own = services.store.observed_here(world, event["seq"])  # this process's writes were observed as made
        if not own:
            services.worlds.observe(world, event)
        services.metrics.events.labels(kind or "unknown").inc()
        hosted = self.hosted.get(world)
        if hosted is not None:
            self._touch(world, hosted)
        services.metrics.observe(world, event)
        for hear in self.heard:
            hear(world, event)
        if kind == vocab.MESSAGE and event.get("approval") and event.get("sender") == vocab.SERVER_SENDER:
            # Whichever process wrote the request, every process holds its deadline (first close wins).
            services.approvals.schedule_timeout(world, event)
        elif kind == vocab.GRANT_ADDED:
            services.approvals.schedule_grant_end(world, event["grant"])
        elif kind == vocab.AGENT_ADDED:
            self._ensure_runner(world, event["agent"]["name"])
        elif kind == vocab.AGENT_REMOVED:
            hosted = self.hosted.get(world)
            runner = hosted.runners.pop(event["name"], None) if hosted else None
            if runner:
                self._spawn(runner.stop(), f"stop-{world}-{event['name']}")
        elif kind == vocab.WORLD_UPDATED:  # from the log: the bus carries settings with secrets masked
            self.world_tools.sync(world, await services.worlds.settings(world))
        elif kind in (vocab.MCP_SIGNED_IN, vocab.MCP_SIGNED_OUT):  # its tokens changed in the vault
            self.world_tools.reconnect(world, event["server"])
        elif kind == vocab.WORLD_DELETED:
            self._spawn(self.unhost(world), f"unhost-{world}")  # not awaited: it cancels this very listener
            return
        # Own events woke the lease holders as they were stored; a settings change wakes them again, its tools synced.
        self._wake_runners(world, event, holders=None if not own or kind == vocab.WORLD_UPDATED else False)
