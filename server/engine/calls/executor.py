"""Runs a server tool call exactly once: claim it in the log, run it, write its result."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ... import events, offload, vocab
from ...aio import cancel_and_wait, keep
from ...log import Batched, Claim, Close, Conflict, Op, Open, Tag
from ...tools.base import Gate, Tool, ToolContext, ToolError
from ...tools.registry import ToolArgumentError, parse_arguments
from ...tools.sandbox.children import watch_children_by_pidfd
from ...vocab import Event
from ..hosting.leases import ProcessLease
from ..store import Store
from ..world.status import StatusBoard
from .backoff import PastDeadline, in_background, until_stored
from .refs import CallRef, append_result, error_content

logger = logging.getLogger(__name__)

BEGAN_TTL = 30 * 86400.0  # seconds a `began` mark outlives a crash (it is removed with the result)
T = TypeVar("T")
ToolLookup = Callable[[str, str], Awaitable[dict[str, Tool]]]  # (world, agent) -> tools by name


def _quiet(task: asyncio.Future[Any]) -> None:
    """Retrieve a side task's outcome nobody waits for any more (no "exception never retrieved")."""
    if not task.cancelled():
        task.exception()


class Executor:
    def __init__(self, store: Store, status: StatusBoard, tools_for: ToolLookup,
                 workspace_for: Callable[[str], Path], process: ProcessLease) -> None:
        self.store = store
        self.status = status
        self.tools_for = tools_for
        self.workspace_for = workspace_for
        self.process = process
        self.network: Gate | None = None  # asks about a call's connections (`ask` mode): the engine sets it
        self.instance = process.instance  # which process started a call: a dead one's calls were interrupted
        self._tasks: set[asyncio.Task[None]] = set()
        self.running: set[str] = set()  # call ids running in this process
        self._starting: dict[str, int] = {}  # call id -> starts in flight
        self._giving_up: dict[str, asyncio.Task[None]] = {}  # call id -> its give-up, until the log takes it
        self._invoking: dict[str, tuple[CallRef, asyncio.Task[str]]] = {}  # call id -> its tool's run (cancel_tool)
        self._stopped_by: dict[str, str] = {}  # call id -> the person who stopped it
        # call id -> the process lease's lapses when its claim was made, and whether it was a re-run's
        self._claimed_at: dict[str, tuple[int, bool]] = {}
        watch_children_by_pidfd()  # a tool's process starts without a watcher thread each (children.py)

    def start_item(self, call: CallRef, *, retry: bool = False, policy: dict[str, Any] | None = None) -> Batched:
        """A `tool_started` event with the claim to run `call`, for a batch: append it, then `launch` the call."""
        event, ops = self._start_event(call, retry, policy)
        return event, self._claiming(call, event, ops, retry)

    async def start(self, call: CallRef, *, retry: bool = False, fenced: Sequence[Op] = ()) -> bool:
        """Claim `call` and run it in the background. False if it was claimed before (it runs once), or a
        `fenced` op refused it (a runner's re-run, whose agent lease another process took meanwhile)."""
        event, ops = self._start_event(call, retry, None)
        try:
            await self.start_with(call, event, [*ops, *fenced], retry=retry)
        except Conflict:
            return False
        return True

    async def start_with(self, call: CallRef, event: Event, ops: Sequence[Op], *, retry: bool = False,
                         also: Sequence[Batched] = ()) -> Event:
        """Append `event` with `ops` and the claim to run `call` (and `also` after it, in the same write),
        then launch it: the one way a call starts in its own write (an approving decision starts its call
        so: deciding and starting are one write).

        Raises `Conflict` when an op fails (e.g. the call was claimed before); then nothing was written
        and nothing runs.
        """
        ops = self._claiming(call, event, ops, retry)
        # Counted as starting before the append: a runner woken by this event must see the
        # call as busy here, never as interrupted — even while a second start of the same
        # call (the decision's and the runner's may race) is about to lose its claim.
        self._starting[call.id] = self._starting.get(call.id, 0) + 1
        try:
            # Launched once stored, not once published too: its `began` write need not wait on the bus.
            stored, *_ = await self.store.append_batch(call.world, [(event, ops), *also],
                                                       on_stored=lambda _: self.launch(call))
        except BaseException:
            if call.id not in self.running:  # not launched (a run that is takes it: `_begin`)
                self._claimed_at.pop(call.id, None)
            raise
        finally:
            self._starting[call.id] -= 1
            if not self._starting[call.id]:
                del self._starting[call.id]
        return stored

    @staticmethod
    def _start_event(call: CallRef, retry: bool, policy: dict[str, Any] | None) -> tuple[Event, list[Op]]:
        """A `tool_started` event and its ops. `policy` says what let a fresh call run without a person's
        decision (a rule, a grant, or the tool's default); such a start is audited."""
        if retry and policy is None:  # a re-run nobody was asked about is on the record too
            policy = {"verdict": "allow", "reason": "re-run after a restart: the tool may run twice safely"}
        event = events.tool_started(call.id, call.name, call.agent, call.chat, retry, policy)
        return event, [Tag(vocab.AUDIT_TAG)] if policy is not None else []

    def _claiming(self, call: CallRef, event: Event, ops: Sequence[Op], retry: bool) -> list[Op]:
        """Mark `event` as the one that starts `call` here: `ops` plus the ops that claim the call."""
        event["instance"] = self.instance  # see vocab.started_by
        self._claimed_at[call.id] = (self.process.lapses, retry)  # a lapse after it: taken for dead, maybe over
        claim = vocab.exec_claim(call.id) + (f":retry:{self.instance}" if retry else "")
        claimed: list[Op] = [Claim(claim), Open(vocab.running_key(call.id), new=not retry),
                             Tag(vocab.trail_tag(call.id))]
        return list(dict.fromkeys([*ops, *claimed]))

    def launch(self, call: CallRef) -> None:
        """Run `call` in the background; its claim was just written."""
        self.running.add(call.id)
        keep(self._tasks, self._run(call), f"tool-{call.id}")

    def busy(self, call_id: str) -> bool:
        """Whether this process is starting or running `call_id`."""
        return call_id in self.running or call_id in self._starting

    def began_key(self, call: CallRef) -> str:
        return f"began:{call.world}:{call.id}"

    async def may_have_begun(self, call: CallRef) -> bool:
        """Whether `call` may have begun running: its `began` mark is written just before the tool runs,
        and removed once its result is stored. A started call without the mark provably never ran."""
        return await self.store.log.lease_holder(self.began_key(call)) is not None

    async def _run(self, call: CallRef) -> None:
        offload.working_for(call.world)  # (a large result's redaction and JSON in the workers)
        # The status goes out, and the tool is looked up and its arguments checked, beside the `began`
        # write: the tool waits on one round trip, not three, and nothing of it runs before the write.
        status = asyncio.ensure_future(
            self.status.set(call.world, call.agent, vocab.RUNNING_TOOL, chat=call.chat, tool=call.name))
        unstarted = f"{call.name} was approved but could not be started"
        began = asyncio.ensure_future(self._begin(call, unstarted))
        try:
            try:
                prepared = await self._retrying(call, lambda: self._prepare(call), failed=unstarted,
                                                what="look up the tool")
                # Before this write completes nothing of the tool has run: a crash until here leaves a call
                # that is started again after the restart, never one reported "interrupted".
                if not await began:  # another process runs it, or will (see _begin)
                    status.add_done_callback(_quiet)
                    return
            except BaseException:
                began.cancel()
                status.add_done_callback(_quiet)
                began.add_done_callback(_quiet)
                raise
            try:
                content = prepared if isinstance(prepared, str) else await self._invoke(call, *prepared)
            except BaseException:
                status.add_done_callback(_quiet)
                raise
            try:
                # Awaited once the tool ran, not before (a busy bus held the tool 0.5-1 ms), but before its
                # result is published: clients see "running" before the result, never after it.
                await status
            except Exception:  # the status is for show: the result is stored when the bus missed it
                logger.warning("the running status of %s was not published", call.id, exc_info=True)
            await self._retrying(call, lambda: self._store_result(call, content), what="store the result",
                                 failed=f"{call.name} finished but its result could not be stored")
        finally:
            # Shutting down (cancelled): the call stays "running" in the log and is reported interrupted on restart.
            self.running.discard(call.id)

    async def _store_result(self, call: CallRef, content: str) -> None:
        try:
            await append_result(self.store, call, content, extra_ops=[Close(vocab.running_key(call.id))])
        except Conflict:
            logger.warning("tool call %s already had a result", call.id)
            return
        await self._forget_began(call)

    async def _begin(self, call: CallRef, unstarted: str) -> bool:
        """Write the `began` mark; whether the tool may run now. Not when another process holds the mark
        (it runs the call), nor when the mark was not written while this process was surely alive: past
        that, another one may have taken it for dead, found the call never begun and run it itself
        (a mark written later would not stop that run, and this one would be the second)."""
        # Alive since the claim was written: a lease taken again after it lapsed does not count.
        lapses, retry = self._claimed_at.pop(call.id, (self.process.lapses, False))
        until = self.process.alive_since(lapses)

        async def mark() -> int:
            token = await self.store.log.lease(self.began_key(call), self.instance, BEGAN_TTL, mark=True)
            if token or not retry:
                return token
            # A re-run (an idempotent call taken over): the mark a dead process left (it lasts BEGAN_TTL)
            # is released in its name, or the re-run would never run and the agent would wait for good.
            holder = await self.store.log.lease_holder(self.began_key(call))
            if holder is None or await self.process.is_alive(holder):
                return token
            await self.store.log.release(self.began_key(call), holder, mark=True)
            return await self.store.log.lease(self.began_key(call), self.instance, BEGAN_TTL, mark=True)

        async def mark_again() -> int:
            # A give-up of this process's first start still being tried: it would land after this run's start.
            await cancel_and_wait(self._giving_up.get(call.id))
            token = await mark()
            if token:  # this process may have given up its first start: this run is not given up (gave_up)
                await self.store.log.release(self.gave_up_key(call, self.instance), self.instance, mark=True)
            return token
        try:
            token = await self._retrying(call, mark_again if retry else mark, failed=unstarted, what="store the start",
                                         until=until)
        except PastDeadline:
            token = 0
        if token and asyncio.get_running_loop().time() < until():
            return True
        if token:  # written too late to count: the mark would only tell a successor the call may have run
            await self._forget_began(call)
        # This process may be alive all along (a moment without Redis, shorter than its lease): others must
        # know it will not run the call, or they would wait on it for good (see gave_up).
        giving_up = keep(self._tasks, in_background(lambda: self._give_up(call, token), f"give up {call.id}"),
                         f"give-up-{call.id}")
        self._giving_up[call.id] = giving_up
        giving_up.add_done_callback(lambda task: self._giving_up.pop(call.id, None) if self._giving_up.get(call.id)
                                    is task else None)
        logger.warning("%s was not started here: its start could not be recorded in time; the agent's runner "
                    "(here or in another process) takes it over", call.id)
        return False

    async def _retrying(self, call: CallRef, write: Callable[[], Awaitable[T]], *, failed: str, what: str,
                        until: Callable[[], float] | None = None) -> T:
        """`write`, tried again while the log cannot take it (`backoff.until_stored`), the agent's status
        saying what waits and why. The call stays busy here meanwhile, so it is never reported
        interrupted while its start or its result waits; and it never hangs on a write refused once."""
        async def tell(exc: Exception, delay: float) -> None:
            try:
                await self.status.set(call.world, call.agent, vocab.RUNNING_TOOL, chat=call.chat, tool=call.name,
                                      last_error=f"{failed} ({exc}); trying again in {delay:g} s")
            except Exception:  # the bus may be down too: the write still waits here
                logger.debug("status not published", exc_info=True)
        return await until_stored(write, what=f"{what} of {call.id}", on_retry=tell, until=until)

    def gave_up_key(self, call: CallRef, instance: str) -> str:
        return f"gaveup:{call.world}:{call.id}:{instance}"

    async def gave_up(self, call: CallRef, instance: str) -> bool:
        """Whether the process `instance` gave `call` up for good (it could not record its start in time)."""
        return await self.store.log.lease_holder(self.gave_up_key(call, instance)) is not None

    async def _give_up(self, call: CallRef, token: int) -> None:
        if token:  # a stale mark would make the call look begun to whoever takes it over
            await self.store.log.release(self.began_key(call), self.instance, mark=True)
        await self.store.log.lease(self.gave_up_key(call, self.instance), self.instance, BEGAN_TTL, mark=True)

    async def _forget_began(self, call: CallRef) -> None:
        try:
            await self.store.log.release(self.began_key(call), self.instance, mark=True)
        except Exception:  # a stale mark only expires later (BEGAN_TTL): the call has its result
            logger.warning("could not remove the began mark of %s", call.id, exc_info=True)

    async def _prepare(self, call: CallRef) -> str | tuple[Tool, dict[str, Any]]:
        """The tool and its checked arguments; or, when it cannot run, the result that says why."""
        tool = (await self.tools_for(call.world, call.agent)).get(call.name)
        if tool is None or tool.run is None:
            return error_content(f"tool {call.name!r} is not available")
        try:
            return tool, parse_arguments(tool, call.arguments)
        except ToolArgumentError as exc:
            return error_content(str(exc))

    async def _invoke(self, call: CallRef, tool: Tool, args: dict[str, Any]) -> str:
        assert tool.run is not None
        try:
            ctx = ToolContext(call.world, call.agent, call.chat, self.workspace_for(call.world), call.id, self.network)
            # Its own task, so cancel_tool can stop the tool alone (the shell tool kills its process group).
            run = asyncio.ensure_future(tool.run(args, ctx))
            self._invoking[call.id] = (call, run)
            try:
                return await run
            finally:
                self._invoking.pop(call.id, None)
        except (ToolError, ToolArgumentError) as exc:
            return error_content(str(exc))
        except asyncio.CancelledError:
            by, current = self._stopped_by.pop(call.id, None), asyncio.current_task()
            if by is not None and not (current is not None and current.cancelling()):
                return error_content(f"{call.name} was stopped by {by}")  # a person stopped it: a result
            raise  # shutting down
        except Exception as exc:  # a tool's bug must not end the agent's turn
            logger.exception("tool %s failed", call.name)
            return error_content(f"{call.name} failed: {type(exc).__name__}: {exc}")

    def cancel_tool(self, world: str, agent: str, by: str) -> bool:
        """Kill the tools `agent` runs in this process; each result says who stopped it. False when none runs."""
        stopped = False
        for call, run in list(self._invoking.values()):
            if call.world == world and call.agent == agent and not run.done():
                self._stopped_by[call.id] = by
                run.cancel()
                stopped = True
        return stopped

    async def stop(self, grace: float = 5.0) -> None:
        """Let running tools finish for `grace` seconds; cancel the rest (they resume as interrupted)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
