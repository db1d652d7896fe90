"""The worlds this process hosts: each one's bus listener and its agents' runners, kept up with what
any process writes (new worlds, agents added or removed, stops asked elsewhere).

A world is hosted while it has work, and released when idle, so that memory follows work, not the
number of worlds. Every process hosts every world of the log's work index (each holds its approvals'
deadlines, and takes over the turns of a process that died); a process hosts any other world on
demand: when it appends to it (a message, a decision) or a socket connects to it. A hosted world is
released `release_after` seconds after its last event or connection, unless it has open work (the
index says, atomically against a write opening work in another process) or a connection here."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from typing import Any

from ... import vocab
from ...aio import cancel_and_wait, keep
from ...bus import Gap, Overflow
from ...events import request_id
from ...log.failures import StorageError
from ...vocab import Event
from ..calls.backoff import in_background
from ..services import Services
from ..turns.runner import AgentRunner
from ..world.tools import WorldTools
from .leases import AgentLease
from .listening import Listening

logger = logging.getLogger(__name__)
WORLDS_CHANNEL = "agent-world:worlds"  # announces new worlds to every process
STOPS_CHANNEL = "agent-world:stops"  # asks whichever process runs an agent's LLM call to stop it


class Hosted:
    """What this process runs for one world: its bus listener and its agents' runners."""

    def __init__(self) -> None:
        self.listener: asyncio.Task[None] | None = None
        self.runners: dict[str, AgentRunner] = {}
        self.listening = asyncio.Event()  # the listener has subscribed (or met trouble and goes on)
        self.subscribed = False  # the listener hears every event of the world now (and caught up)
        self.whole = False  # its runners and approval timers are set up too: `host` has nothing left to do
        self.connections = 0  # sockets of this process open on it: it is not released while any is
        self.touched = 0  # counts the events heard or written and connections ended: a release checks it
        self.release: asyncio.TimerHandle | None = None  # when it is looked at for release


class Hosting(Listening):
    def __init__(self, services: Services, world_tools: WorldTools, release_after: float = 60.0) -> None:
        self.services = services
        self.world_tools = world_tools
        self.hosted: dict[str, Hosted] = {}
        self.release_after = release_after
        self.started = False  # the engine runs (a CLI's engine writes without hosting anything)
        self._chores: set[asyncio.Task[None]] = set()  # short jobs started from a listener (see _spawn)
        self._retrying: set[asyncio.Task[None]] = set()  # jobs tried again while the storage refuses them
        # Worlds being released: hosting one again waits for that to end, or its end (closing the
        # world's tools, forgetting its status) would undo the new hosting's.
        self._unhosting: dict[str, asyncio.Future[None]] = {}
        # Told of every event heard (any process's, public), and of the requests pending when a world is
        # hosted here: webhooks and escalations (server/engine/notify/).
        self.heard: list[Callable[[str, Event], None]] = []
        self.found_pending: list[Callable[[str, list[Event]], None]] = []
        services.store.observers.append(lambda world, event: self._wake_runners(world, event, holders=True))
        services.store.observers.append(self._written)
        services.store.log.on_listed = self.listed

    def _written(self, world: str, event: Event) -> None:
        """An event appended here: its world is hosted here (on demand) if it was not."""
        if not self.started or event.get("kind") == vocab.WORLD_DELETED:
            return
        hosted = self.hosted.get(world)
        if hosted is None:
            self._spawn(self._host_on_demand(world), f"host-{world}")
        else:
            self._touch(world, hosted)

    async def _host_on_demand(self, world: str) -> None:
        if await self.services.worlds.exists(world):
            await self.host(world)

    def listed(self, world: str) -> None:
        """The log put `world` into the work index (its first work item, from here): every process hosts it."""
        if self.started:
            self._spawn(self.announce(world), f"announce-{world}")

    @asynccontextmanager
    async def connected(self, world: str) -> AsyncIterator[None]:
        """Keep `world` hosted while a socket of this process is open on it (if it exists)."""
        if self.started and await self.services.worlds.exists(world):
            await self.host(world)
        hosted = self.hosted.get(world)
        if hosted is None:  # not hosted (no such world, or the CLI's engine): nothing to hold
            yield
            return
        hosted.connections += 1
        try:
            yield
        finally:
            hosted.connections -= 1
            if self.hosted.get(world) is hosted:
                self._touch(world, hosted)

    def _touch(self, world: str, hosted: Hosted) -> None:
        """Something happened in `world`: look at it for release `release_after` seconds from now."""
        hosted.touched += 1
        if hosted.release is not None:
            hosted.release.cancel()
        hosted.release = None
        if hosted.connections == 0 and self.started:
            hosted.release = asyncio.get_running_loop().call_later(
                self.release_after, lambda: self._spawn(self._release(world, hosted), f"release-{world}"))

    async def _release(self, world: str, hosted: Hosted) -> None:
        """Unhost `world` if it is idle: no socket here, nothing heard or written since this was armed
        (`touched`), and no open work (`unlist_if_idle` also takes it out of the work index)."""
        touched = hosted.touched
        if self.hosted.get(world) is not hosted or hosted.connections or not hosted.whole:
            return
        try:
            idle = await self.services.store.log.unlist_if_idle(world)
        except StorageError as exc:
            logger.warning("could not release %s (%s): trying again later", world, exc)
            self._touch(world, hosted)
            return
        if not idle or hosted.touched != touched or hosted.connections or self.hosted.get(world) is not hosted:
            return  # its next event (or connection's end) looks again
        # An append here from now on finds it unhosted and hosts it again (`_written`).
        await self.unhost(world)

    def _wake_runners(self, world: str, event: Event, holders: bool | None = None) -> None:
        """Wake the runners an event concerns (`holders`: only those that hold their lease, or only the
        others). One appended here wakes the holders as it is stored, a bus hop sooner than its echo (on
        a tool result's way to the next LLM call); the others when the listener hears it: a runner
        without the lease tries to take it and reads, round trips better spent after the publish."""
        hosted = self.hosted.get(world)
        for runner in hosted.runners.values() if hosted else ():
            if (holders is None or runner.lease.holds == holders) and runner.concerns(event):
                runner.wake()

    def agent_leases(self) -> Iterator[AgentLease]:
        for hosted in list(self.hosted.values()):
            for runner in list(hosted.runners.values()):
                yield runner.lease

    def runner(self, world: str, agent: str) -> AgentRunner | None:
        hosted = self.hosted.get(world)
        return hosted.runners.get(agent) if hosted else None

    async def stop(self) -> None:
        """Stop every runner, then every listener (after the jobs the listeners started)."""
        # Given up: others find such a world at their next listing (a gap, a start); a world hosted
        # again here after a storage loss is hosted again at the next start.
        for task in list(self._retrying):
            await cancel_and_wait(task)
        if self._chores:
            await asyncio.gather(*self._chores, return_exceptions=True)
        for hosted in list(self.hosted.values()):
            for runner in hosted.runners.values():
                await runner.stop()

    async def unhost_all(self) -> None:
        for world in list(self.hosted):
            await self.unhost(world)

    def _spawn(self, job: Coroutine[Any, Any, None], name: str) -> None:
        """Run `job` beside the caller, tracked: awaited at stop, and its failure logged, never dropped."""
        task = asyncio.create_task(job, name=name)
        self._chores.add(task)
        task.add_done_callback(self._chore_done)

    def _chore_done(self, task: asyncio.Task[None]) -> None:
        self._chores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("engine job %s failed", task.get_name(), exc_info=task.exception())

    async def announce(self, world: str) -> None:
        """Tell every process of a new world (stored, and hosted here), so that they host it at once.
        Its creator is never told it failed: while the bus refuses it, it is tried again in the
        background (nothing else would tell a process that stays connected)."""
        try:
            await self._announce(world)
        except StorageError as exc:
            logger.warning("new world %s not announced to other processes (%s): trying again in the background",
                        world, exc)
            keep(self._retrying, in_background(lambda: self._announce(world), f"announce {world}"),
                 f"announce-{world}")
        except Exception:  # a bug: logged, and the world's creator is not failed by it
            logger.exception("new world %s not announced to other processes", world)

    async def _announce(self, world: str) -> None:
        await self.services.store.bus.publish(WORLDS_CHANNEL, world)

    async def follow_new_worlds(self, ready: asyncio.Event) -> None:
        """Host worlds that other processes create; after a gap in the bus, every world not hosted yet."""
        cut_off = False
        while True:
            async with self.services.store.bus.subscribe(WORLDS_CHANNEL, maxsize=10_000) as sub:
                ready.set()
                if cut_off:  # it fell behind: what it missed is in the log's list
                    await self.host_new(None)
                while True:
                    try:
                        news: list[str] | None = [await sub.get()]
                    except Overflow:
                        cut_off = True
                        break  # nothing more comes on that subscription: subscribe again
                    except Gap as gap:
                        if gap.down:
                            continue
                        news = None  # back: a world announced meanwhile is in the log's list
                    await self.host_new(news)

    async def host_new(self, news: list[str] | None) -> None:
        """Host the worlds in `news` (every world of the log when None) that exist and are not hosted yet."""
        store, worlds = self.services.store, self.services.worlds
        while True:
            try:
                for world in news if news is not None else await store.log.worlds_with_work():
                    if not self._whole(world) and await worlds.exists(world):
                        await self.host(world)
                return
            except Exception as exc:  # the storage may still be recovering: try again
                logger.warning("could not host worlds (%s: %s); trying again in 1 s", type(exc).__name__, exc)
                await asyncio.sleep(1.0)

    def _whole(self, world: str) -> bool:
        hosted = self.hosted.get(world)
        return hosted is not None and hosted.whole

    async def host(self, world: str) -> None:
        """Listen to the world, run its agents and arm its approvals' timers. When a read fails midway
        (the storage down a moment), hosting it again does the rest (its listener runs already)."""
        while (unhosting := self._unhosting.get(world)) is not None:
            await asyncio.wait([unhosting])
        if self._whole(world):
            return
        services = self.services
        hosted = self.hosted.get(world)
        if hosted is None:
            hosted = self.hosted[world] = Hosted()
            hosted.listener = asyncio.create_task(self._listen(world, hosted.listening), name=f"listen-{world}")
        await hosted.listening.wait()
        self.world_tools.sync(world, await services.worlds.settings(world))
        for agent in await services.worlds.agents(world):
            self._ensure_runner(world, agent["name"])
        pending = await services.approvals.pending(world)
        services.metrics.pending_found(world, (request_id(approval) for approval in pending))
        for approval in pending:
            services.approvals.schedule_timeout(world, approval)
        for found in self.found_pending:
            found(world, pending)
        for grant in await services.worlds.grants(world):  # a time-boxed one ends here too, whoever granted it
            services.approvals.schedule_grant_end(world, grant["grant"])
        try:
            await services.approvals.resume(world, pending)
        except StorageError:
            raise  # hosting it again does the rest
        except Exception:
            logger.exception("could not resume the pending requests of %s", world)  # a bug: hosting goes on
        hosted.whole = True
        self._touch(world, hosted)

    async def unhost(self, world: str) -> None:
        hosted = self.hosted.pop(world, None)
        if hosted is None:
            return
        done = self._unhosting[world] = asyncio.get_running_loop().create_future()
        try:
            if hosted.release is not None:
                hosted.release.cancel()
            for runner in hosted.runners.values():
                await runner.stop()
            await cancel_and_wait(hosted.listener)
            await self.world_tools.close(world)
            self.services.status.forget(world)
            self.services.worlds.forget(world)  # no listener hears of its changes from now on
        finally:
            done.set_result(None)
            if self._unhosting.get(world) is done:
                del self._unhosting[world]

    def hears(self, world: str) -> bool:
        """Whether this process hears every change of `world` now: its listener is subscribed."""
        hosted = self.hosted.get(world)
        return hosted is not None and hosted.subscribed

    def _ensure_runner(self, world: str, agent: str) -> None:
        hosted = self.hosted.get(world)
        if hosted is not None and agent not in hosted.runners:
            runner = hosted.runners[agent] = AgentRunner(self.services, world, agent)
            runner.start()
            runner.wake()


    def wake_all(self, world: str) -> None:
        hosted = self.hosted.get(world)
        if hosted:
            for runner in hosted.runners.values():
                runner.wake()

    def stop_here(self, world: str, agent: str, by: str) -> bool:
        runner = self.runner(world, agent)
        return runner is not None and runner.stop_turn(by)

    async def ask_stop(self, world: str, agent: str, by: str) -> None:
        """Ask every process to stop `agent`'s LLM call: the one that runs it does (see follow_stops)."""
        await self.services.store.bus.publish(STOPS_CHANNEL, json.dumps({"world": world, "agent": agent, "by": by}))

    async def follow_stops(self, ready: asyncio.Event) -> None:
        """Stops asked of another process (see Engine.cancel_turn)."""
        while True:
            async with self.services.store.bus.subscribe(STOPS_CHANNEL, maxsize=1000) as sub:
                ready.set()
                while True:
                    try:
                        text = await sub.get()
                    except Gap:
                        continue  # a stop asked while the bus was away is lost: the person can ask again
                    except Overflow:
                        break  # cut off (those stops are lost too): subscribe again
                    try:
                        stop = json.loads(text)
                        self.stop_here(str(stop["world"]), str(stop["agent"]), str(stop["by"]))
                    except (ValueError, KeyError, TypeError):
                        logger.warning("ignored a malformed stop on %s", STOPS_CHANNEL)
