"""Lease fencing: a process paused past its agent's lease (SIGSTOP) cannot finish the turn another took over.

The paused process is a real child process on the shared Redis; the other one is an engine in the test.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.aio import cancel_and_wait
from server.bus import Bus
from server.bus.redis import RedisBackend
from server.engine.actors import Actor
from server.engine.engine import Engine
from server.log.redis.log import RedisLog
from server.testing.openai_double import Delay, OpenAIDouble, Text
from tests.fixtures.engine import tool_calls
from tests.fixtures.storage import delete_prefix, unique_name

ROOT = Path(__file__).resolve().parents[2]
TTL = 1.0  # seconds: the agents' lease in both processes
LLM_DELAY = 3.0  # the paused process's LLM answer comes this long after its request

# The first process: creates a world whose agent answers "hello", prints READY <world>, and runs on.
CHILD = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from server import vocab
from server import vocab
from server.aio import cancel_and_wait
from server.bus import Bus
from server.bus.redis import RedisBackend
from server.engine.actors import Actor
from server.engine.actors import Actor
from server.engine.engine import Engine
from server.log.redis.log import RedisLog

async def main(root, url, prefix, llm, data_dir, ttl):
    log = await RedisLog.open(url, prefix)
    bus = Bus(RedisBackend(url, prefix=prefix))
    await bus.connect()
    engine = Engine(log, bus, data_dir=data_dir, lease_ttl=float(ttl))
    await engine.start()
    owner = Actor("olivia", vocab.OWNER)
    world = (await engine.create_world(owner, "Fenced", agents=[
        {"name": "alice", "provider": "openai", "model": "m", "base_url": llm}]))["id"]
    await engine.post_message(world, owner, "hello")
    print("READY", world, flush=True)
    await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    name = unique_name()
    yield name
    delete_prefix(redis_url, name)


@pytest.fixture
async def second_engine(redis_url: str, prefix: str, tmp_path: Path) -> AsyncIterator[list[Engine]]:
    """Engines started by the test (the process that takes over), stopped afterwards."""
    engines: list[Engine] = []
    yield engines
    for engine in engines:
        await engine.stop(grace=1)
        await engine.store.bus.disconnect()
        await engine.store.log.close()


def start_child(redis_url: str, prefix: str, llm: OpenAIDouble, data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT), redis_url, prefix, llm.base_url,
                             str(data_dir), str(TTL)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise AssertionError(f"the child process did not start: {line!r}")
    return proc, line.split()[1]


async def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("answer", ["text", "tool_call"])
async def test_a_process_paused_past_its_lease_cannot_finish_the_turn_taken_over(
        answer: str, redis_url: str, prefix: str, tmp_path: Path, llm_double: OpenAIDouble,
        second_engine: list[Engine]) -> None:
    def reply(n: int) -> Any:
        if answer == "text":
            return Text(f"reply {n}")
        return tool_calls(("shell_exec", {"command": f"echo {n} >> ran.txt"}))

    count = 0

    def respond(body: dict[str, Any]) -> Any:
        nonlocal count
        count += 1
        # The first process's answer is late: it arrives while that process is stopped.
        return Delay(LLM_DELAY, reply(count)) if count == 1 else reply(count)

    llm_double.respond_with(respond)
    child, world = start_child(redis_url, prefix, llm_double, tmp_path / "child")
    try:
        await llm_double.wait_for_requests_async(1)
        os.kill(child.pid, signal.SIGSTOP)  # paused mid-turn, its lease running out
        stopped = asyncio.get_running_loop().time()
        log = await RedisLog.open(redis_url, prefix)
        bus = Bus(RedisBackend(redis_url, prefix=prefix))
        await bus.connect()
        other = Engine(log, bus, data_dir=tmp_path / "other", lease_ttl=TTL)
        second_engine.append(other)
        await other.start()

        async def answered_by_other() -> bool:
            return await _answers(other, world) >= 1

        await wait_until(answered_by_other)  # the other process took the lease over and answered
        # Resumed once its late answer is waiting for it in its socket.
        await asyncio.sleep(max(0.0, stopped + LLM_DELAY + 0.3 - asyncio.get_running_loop().time()))
        os.kill(child.pid, signal.SIGCONT)
        await asyncio.sleep(2.0)  # time for the resumed process to do whatever it would do
        assert await _answers(other, world) == 1, [
            e for e in await other.events(world) if e.get("role") == "assistant"]
        assert len(await other.pending_approvals(world)) == (1 if answer == "tool_call" else 0)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
        child.wait(5)


async def _answers(engine: Engine, world: str) -> int:
    """How many times alice answered (a text reply or a request for approval of her call)."""
    events = await engine.events(world)
    replies = [e for e in events if e.get("role") == "assistant" and e.get("sender") == "alice"]
    return len(replies)


async def test_a_process_that_cannot_renew_its_lease_stops_the_turn_before_the_lease_ends(
        tmp_path: Path, llm_double: OpenAIDouble, second_engine: list[Engine],
        caplog: pytest.LogCaptureFixture) -> None:
    from tests.fixtures.engine import OWNER
    from tests.fixtures.redis_servers import RedisRelay, RedisServer

    redis_server = RedisServer(tmp_path / "redis").start()
    partition = RedisRelay(redis_server.port)
    try:
        asked = 0

        def respond(body: dict[str, Any]) -> Any:
            nonlocal asked
            asked += 1
            return Delay(LLM_DELAY, Text("from the cut-off process")) if asked == 1 else Text("from the other one")

        llm_double.respond_with(respond)

        async def open_engine(url: str) -> Engine:
            log = await RedisLog.open(url)
            bus = Bus(RedisBackend(url))
            await bus.connect()
            engine = Engine(log, bus, data_dir=tmp_path / "engines", lease_ttl=TTL * 2)
            await engine.start()
            second_engine.append(engine)
            return engine

        cut_off = await open_engine(await partition.start())  # it goes through the relay
        world = (await cut_off.create_world(OWNER, "Partitioned", agents=[
            {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
        await cut_off.post_message(world, OWNER, "hello")
        await llm_double.wait_for_requests_async(1)  # the cut-off process holds alice's lease and asked
        # Only now the other process: had it started first, it could have taken alice's lease itself.
        other = await open_engine(redis_server.url)
        caplog.set_level("WARNING", logger="server.engine.hosting.leases")
        partition.cut()
        cut_at = time.time()  # its lease ends at most TTL * 2 later: its last renewal was before the cut

        async def answered() -> bool:
            return await _answers(other, world) >= 1

        await wait_until(answered, timeout=15)
        gave_up = [r for r in caplog.records if "lease lost" in r.getMessage()]
        assert gave_up, "the cut-off process never stopped its turn"
        assert gave_up[0].created - cut_at < TTL * 2, "it stopped only after its lease had ended"
        assert [e["content"] for e in await other.events(world) if e.get("sender") == "alice"] == ["from the other one"]
    finally:
        partition.heal()  # so that the cut-off engine can stop cleanly
        while second_engine:  # before their Redis goes
            engine = second_engine.pop()
            await engine.stop(grace=1)
            await engine.store.bus.disconnect()
            await engine.store.log.close()
        await partition.stop()
        redis_server.stop()


async def test_a_runner_reads_its_turns_again_when_its_lease_changed_hands_during_the_read(
        redis_url: str, prefix: str, tmp_path: Path, llm_double: OpenAIDouble, second_engine: list[Engine],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While it holds the lease, a runner reads the turns beside its renewal (a round trip less); when
    the renewal gives a new token, someone else may have held the lease and written meanwhile: it reads
    them again."""
    log = await RedisLog.open(redis_url, prefix)
    bus = Bus(RedisBackend(redis_url, prefix=prefix))
    await bus.connect()
    engine = Engine(log, bus, data_dir=tmp_path / "data", lease_ttl=30.0)
    second_engine.append(engine)
    await engine.start()
    world = (await engine.create_world(Actor("olivia", vocab.OWNER), "Reads", agents=[
        {"name": "alice", "provider": "openai", "model": "m", "base_url": llm_double.base_url}]))["id"]
    runner = engine.hosting.runner(world, "alice")
    assert runner is not None
    async with asyncio.timeout(10):
        while not runner.lease.holds:
            await asyncio.sleep(0.02)
    await cancel_and_wait(runner.task)  # its own loop stays out of the count (the lease stays held)
    reads = 0
    read = runner._turns_and_memory

    async def counted() -> Any:
        nonlocal reads
        reads += 1
        return await read()
    monkeypatch.setattr(runner, "_turns_and_memory", counted)

    fence = runner.lease.fence
    await runner._renew_and_read()  # held all along: one read, beside the renewal
    assert (reads, runner.lease.holds, runner.lease.fence) == (1, True, fence)
    # The lease ends behind the runner's back (as when it expired): the renewal takes it anew, with a
    # new token, so the turns are read again.
    await log.release(runner.lease.name, engine.services.leases.instance, world=world)
    await runner._renew_and_read()
    assert runner.lease.holds and runner.lease.fence > fence
    assert reads == 3
