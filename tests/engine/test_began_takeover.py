"""A process killed while an idempotent tool ran leaves its `began` mark (held in its name for
BEGAN_TTL): the process that takes the call over must still re-run it, not leave the agent hanging."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from server import vocab
from server.bus import Bus
from server.bus.memory import MemoryBackend
from server.engine.calls.executor import BEGAN_TTL
from server.engine.calls.refs import CallRef
from server.engine.hosting.leases import process_lease
from server.engine.store import Store
from server.log import Claim, Open, Tag
from server.log.failures import StorageError
from server.log.redis.log import RedisLog
from tests.fixtures.eventually import eventually_async
from tests.fixtures.recorded_tool import RecordedTool
from tests.fixtures.redis_servers import RedisServer

TTL = 1.5


async def test_an_idempotent_call_whose_dead_starter_left_its_began_mark_is_re_run_by_the_taker(
        tmp_path: Path, private_redis: RedisServer) -> None:
    log = await RedisLog.open(private_redis.url, "aw")
    bus = Bus(MemoryBackend())
    await bus.connect()
    reads = RecordedTool(tmp_path, TTL, "file_read", idempotent=True)
    runs = reads.runs
    b = reads.executor(Store(log, bus), "proc-b")
    try:
        await b.process.take()
        call = CallRef("w", "agent", "main", "call_1", "file_read", "{}")
        # proc-a started the call, wrote its `began` mark and was killed while the tool ran
        await log.append("w", {"kind": vocab.TOOL_STARTED, "call_id": call.id, "tool": call.name,
                               "agent": call.agent, "chat": call.chat, "retry": False, "instance": "proc-a"},
                         [Open(vocab.call_key(call.id)), Claim(vocab.exec_claim(call.id)),
                          Open(vocab.running_key(call.id)), Tag(vocab.trail_tag(call.id))])
        assert await log.lease(b.began_key(call), "proc-a", BEGAN_TTL)
        # b's runner (AgentRunner._interrupted): it may have begun, the tool is idempotent: re-run it
        assert await b.may_have_begun(call)
        assert await b.start(call, retry=True)
        await eventually_async(lambda: _answered(log, call), timeout=5, what="the re-run's result")
        assert runs == ["call_1"]
    finally:
        await b.stop(grace=0)
        await bus.disconnect()
        await log.close()


async def _answered(log: RedisLog, call: CallRef) -> bool:
    return any(e.get("role") == "tool" for e in await log.read_tagged("w", [vocab.trail_tag(call.id)]))


class Paused:
    """One process's view of the shared log: its `began` writes wait while `gate` is shut (the process
    stopped by SIGSTOP before it sent the write)."""

    def __init__(self, log: RedisLog) -> None:
        self._log = log
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    async def lease(self, name: str, holder: str, ttl: float, **where: Any) -> int:
        if name.startswith("began:"):
            await self.gate.wait()
        return await self._log.lease(name, holder, ttl, **where)


async def test_a_process_paused_past_its_lease_before_its_began_write_never_runs_the_call_taken_over(
        tmp_path: Path, private_redis: RedisServer) -> None:
    """a approves a call (its claim written) and is stopped before its `began` write; b takes the call
    over once a's lease lapsed, runs it, stores the result. a wakes: its heartbeat takes its lease again
    first, then its `began` write lands on a free mark. The lease is held again, but it lapsed in
    between: the call must not run a second time."""
    log = await RedisLog.open(private_redis.url, "aw")
    bus = Bus(MemoryBackend())
    await bus.connect()
    charges = RecordedTool(tmp_path, TTL)
    runs, executor = charges.runs, charges.executor
    view = Paused(log)
    a = executor(Store(view, bus), "proc-a")  # type: ignore[arg-type]
    b = executor(Store(log, bus), "proc-b")
    try:
        await a.process.take()
        await b.process.take()
        call = CallRef("w", "agent", "main", "call_1", "charge_card", "{}")
        await log.append("w", {"kind": vocab.MESSAGE, "role": "assistant", "chat": "main", "agent": "agent"},
                         [Open(vocab.call_key(call.id))])
        assert await a.start(call)  # the decision's write: claimed, started by a
        await eventually_async(lambda: _lapsed(log, "proc-a"), timeout=TTL + 5, what="a's lease to end")
        # b's runner: the starter is dead and the call provably never began: b runs it
        assert not await b.may_have_begun(call)
        await b.process.take()
        assert await b.start(call, retry=True)
        await eventually_async(lambda: _answered(log, call), timeout=5, what="b's result")
        await eventually_async(lambda: not b.busy(call.id), timeout=5, what="b's run to end")
        # a wakes up: its overdue heartbeat renews its lease, then its `began` write goes out
        await a.process.take()
        view.gate.set()
        await eventually_async(lambda: not a.busy(call.id), timeout=5, what="a to give the call up")
        assert runs == ["call_1"]
    finally:
        await a.stop(grace=0)
        await b.stop(grace=0)
        await bus.disconnect()
        await log.close()


async def _lapsed(log: RedisLog, instance: str) -> bool:
    return await log.lease_holder(process_lease(instance)) is None


class CutOff:
    """One process's view of the shared log: its `began` writes fail while `cut` (Redis unreachable from it)."""

    def __init__(self, log: RedisLog) -> None:
        self._log = log
        self.cut = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    async def lease(self, name: str, holder: str, ttl: float, **where: Any) -> int:
        if self.cut and name.startswith("began:"):
            raise StorageError("Redis unreachable from this process a moment")
        return await self._log.lease(name, holder, ttl, **where)


async def test_a_call_its_starter_gave_up_and_then_re_ran_itself_is_not_taken_for_given_up(
        tmp_path: Path, private_redis: RedisServer) -> None:
    """a's `began` write failed past its lease's margin: a gave the call up (its `gaveup:` mark). a's own
    runner then took the call over (AgentRunner._interrupted: retry, started by a again), and its re-run
    is running. Another runner (the agent's lease moved) must find the call still running in a, not given
    up: it would re-run it a second time, or report a call that is running "interrupted"."""
    log = await RedisLog.open(private_redis.url, "aw")
    bus = Bus(MemoryBackend())
    await bus.connect()
    release = asyncio.Event()
    charges = RecordedTool(tmp_path, TTL, until=release)
    runs, executor = charges.runs, charges.executor
    view = CutOff(log)
    a = executor(Store(view, bus), "proc-a")  # type: ignore[arg-type]
    b = executor(Store(log, bus), "proc-b")
    try:
        await a.process.take()
        call = CallRef("w", "agent", "main", "call_1", "charge_card", "{}")
        await log.append("w", {"kind": vocab.MESSAGE, "role": "assistant", "chat": "main", "agent": "agent"},
                         [Open(vocab.call_key(call.id))])
        assert await a.start(call)  # the decision's write: claimed, started by a
        await eventually_async(lambda: b.gave_up(call, "proc-a"), timeout=TTL + 5, what="a to give the call up")
        view.cut = False
        await a.process.take()  # the moment healed: a's heartbeat
        # a's runner: started by a, not busy here, never began: a re-runs it (AgentRunner._interrupted)
        assert not await a.may_have_begun(call)
        assert await a.start(call, retry=True)
        await eventually_async(lambda: runs == ["call_1"], timeout=5, what="a's re-run")
        # What another runner asks of the last starter (AgentRunner._settle): running there, not given up
        assert await a.process.is_alive("proc-a")
        assert not await b.gave_up(call, "proc-a")
    finally:
        release.set()
        await a.stop(grace=1)
        await b.stop(grace=0)
        await bus.disconnect()
        await log.close()


class CutOffLonger(CutOff):
    """As CutOff, and its `gaveup:` writes fail while `gaveup_cut`: its giving up is still being tried."""

    gaveup_cut = True

    async def lease(self, name: str, holder: str, ttl: float, **where: Any) -> int:
        if self.gaveup_cut and name.startswith("gaveup:"):
            raise StorageError("Redis unreachable from this process a moment")
        return await super().lease(name, holder, ttl, **where)


async def test_a_give_up_still_being_written_when_its_starter_re_runs_the_call_does_not_mark_the_re_run(
        tmp_path: Path, private_redis: RedisServer) -> None:
    """As above, but a's `gaveup:` write (in the background, tried again until the log takes it) was
    still on its way when a's runner re-ran the call: landing after the re-run's start, it must not mark
    the re-run given up (another runner would run the call a second time)."""
    log = await RedisLog.open(private_redis.url, "aw")
    bus = Bus(MemoryBackend())
    await bus.connect()
    release = asyncio.Event()
    charges = RecordedTool(tmp_path, TTL, until=release)
    runs, executor = charges.runs, charges.executor
    view = CutOffLonger(log)
    a = executor(Store(view, bus), "proc-a")  # type: ignore[arg-type]
    b = executor(Store(log, bus), "proc-b")
    try:
        await a.process.take()
        call = CallRef("w", "agent", "main", "call_1", "charge_card", "{}")
        await log.append("w", {"kind": vocab.MESSAGE, "role": "assistant", "chat": "main", "agent": "agent"},
                         [Open(vocab.call_key(call.id))])
        assert await a.start(call)
        await eventually_async(lambda: not a.busy(call.id), timeout=TTL + 5, what="a to give the call up")
        view.cut = False
        await a.process.take()
        assert not await a.may_have_begun(call)
        assert await a.start(call, retry=True)
        await eventually_async(lambda: runs == ["call_1"], timeout=5, what="a's re-run")
        view.gaveup_cut = False  # the give-up's next try goes through
        await eventually_async(lambda: not [t for t in a._tasks if t.get_name().startswith("give-up-")], timeout=15,
                               what="a's give-up to be written")
        assert await a.process.is_alive("proc-a")
        assert not await b.gave_up(call, "proc-a")
        assert await b.may_have_begun(call)
    finally:
        release.set()
        await a.stop(grace=1)
        await b.stop(grace=0)
        await bus.disconnect()
        await log.close()
