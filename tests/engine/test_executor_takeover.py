"""Two processes on one log: a process that cannot record a tool's start while it is surely alive never
runs that tool, so the process that takes the call over runs it the one time."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from server.bus import Bus
from server.bus.memory import MemoryBackend
from server.engine.calls.refs import CallRef
from server.engine.hosting.leases import process_lease
from server.engine.store import Store
from server.log.failures import StorageError
from server.log.sqlite import SqliteLog
from tests.fixtures.eventually import eventually_async
from tests.fixtures.recorded_tool import RecordedTool

TTL = 1.5  # seconds: each process's lease
RETRY_WINDOW = 1.5  # longer than the executor's first retry delays (0.5 s, then 1 s)


class CutOff:
    """One process's view of the shared log: its writes of `began` marks fail while `cut` is set."""

    def __init__(self, log: SqliteLog) -> None:
        self._log = log
        self.cut = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    async def lease(self, name: str, holder: str, ttl: float, **where: Any) -> int:
        if self.cut and name.startswith("began:"):
            raise StorageError("Redis unreachable from this process")
        return await self._log.lease(name, holder, ttl, **where)


async def test_a_process_that_could_not_record_a_start_in_time_never_runs_the_call_taken_over(
        tmp_path: Path) -> None:
    log = await SqliteLog.open(tmp_path / "log.sqlite3")
    bus = Bus(MemoryBackend())
    await bus.connect()
    charges = RecordedTool(tmp_path, TTL)
    runs, executor = charges.runs, charges.executor
    view = CutOff(log)
    a = executor(Store(view, bus), "proc-a")  # type: ignore[arg-type]
    b = executor(Store(log, bus), "proc-b")
    try:
        await a.process.take()
        await b.process.take()
        call = CallRef("w", "agent", "main", "call_1", "charge_card", "{}")
        assert await a.start(call)
        # a keeps trying to record the start, and gives up before anyone may take it for dead
        await eventually_async(lambda: not a.busy(call.id), timeout=TTL + 5, what="a to give the call up")
        assert runs == []
        # b's runner, once a's lease is over: the call provably never began, so b runs it
        await eventually_async(lambda: _lapsed(log, "proc-a"), timeout=TTL + 5, what="a's lease to end")
        assert not await b.may_have_begun(call)
        await b.process.take()  # (its heartbeat, in an engine)
        assert await b.start(call, retry=True)
        await eventually_async(lambda: not b.busy(call.id), timeout=5, what="b's run")
        view.cut = False  # a reaches the log again: nothing of its own is left to run
        await asyncio.sleep(RETRY_WINDOW)
        assert runs == ["call_1"]
    finally:
        await a.stop(grace=0)
        await b.stop(grace=0)
        await bus.disconnect()
        await log.close()


async def _lapsed(log: SqliteLog, instance: str) -> bool:
    return await log.lease_holder(process_lease(instance)) is None
