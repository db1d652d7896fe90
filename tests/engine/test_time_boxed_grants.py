"""Time-boxed grants (scope `for`, docs/protocol.md §4): a grant for this chat that ends by itself, in
every process, once on the record (`grant_expired`), even after kill -9 of the process that granted it."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.bus import Bus
from server.bus.redis import RedisBackend
from server.engine.approvals.decisions import parse_decision
from server.engine.engine import Engine
from server.errors import AppError
from server.log.redis.log import RedisLog
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.engine import OWNER, Harness, open_engine, reply_by_turn, run_on_request, tool_calls
from tests.fixtures.eventually import eventually_async
from tests.fixtures.storage import delete_prefix, unique_name

CHILD = Path(__file__).parents[1] / "fixtures" / "engine_child.py"


def _soon(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def _ask(harness: Harness, command: str) -> None:
    await harness.say(f"run {command}")


def _expired(events: list[vocab.Event]) -> list[vocab.Event]:
    return [e for e in events if e.get("kind") == vocab.GRANT_EXPIRED]


async def test_a_grant_for_some_time_lets_calls_run_until_its_end_then_ends_once(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(run_on_request)
    await _ask(harness, "echo a >> ran.txt")
    [pending] = await harness.wait_pending(1)
    decided = await harness.decide(pending["id"], "approve", "for", until=_soon(2.5))
    assert decided["decision"]["scope"] == "for" and decided["decision"]["until"]
    [grant] = await harness.engine.grants(harness.world)
    assert grant["expires_at"] == decided["decision"]["until"]
    await _ask(harness, "echo b >> ran.txt")  # within the time: no person asked
    [ran] = await harness.wait_for(lambda e: e.get("kind") == vocab.TOOL_STARTED, timeout=20)
    assert ran["policy"]["grant_id"] == grant["id"]
    assert await harness.engine.pending_approvals(harness.world) == []
    [ended] = await harness.wait_for(lambda e: e.get("kind") == vocab.GRANT_EXPIRED, timeout=10)
    assert ended["grant_id"] == grant["id"] and ended["sender"] == vocab.SERVER_SENDER
    assert await harness.engine.grants(harness.world) == []
    await harness.idle(timeout=20)
    await _ask(harness, "echo c >> ran.txt")  # after it: a person again
    [again] = await harness.wait_pending(1, timeout=10)
    assert again["request"]["toolArguments"] == {"command": "echo c >> ran.txt"}
    assert len(_expired(await harness.events())) == 1
    # A grant already ended is not ended twice, nor revocable.
    assert not await harness.engine.approvals.end_grant(harness.world, {**grant, "chat": grant["chat"]})
    with pytest.raises(AppError):
        await harness.engine.approvals.revoke_grant(harness.world, OWNER, grant["id"])


async def test_a_time_boxed_grant_can_be_revoked_before_its_end_and_then_never_expires(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(run_on_request)
    await _ask(harness, "echo a >> ran.txt")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"], "approve", "for", minutes=30)
    [grant] = await harness.engine.grants(harness.world)
    await harness.engine.approvals.revoke_grant(harness.world, OWNER, grant["id"])
    assert await harness.engine.grants(harness.world) == []
    past = {**grant, "expires_at": "2000-01-01T00:00:00.000Z"}
    assert not await harness.engine.approvals.end_grant(harness.world, past)  # closed already: nothing written
    assert _expired(await harness.events()) == []


async def test_a_time_boxed_grant_never_covers_what_an_ask_rule_sends_to_people(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(run_on_request)
    await _ask(harness, "echo a >> ran.txt")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"], "approve", "for", minutes=30)
    await harness.idle(timeout=20)
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": "echo b*"}, "ask")
    await _ask(harness, "echo b >> ran.txt")
    [asked] = await harness.wait_pending(1, timeout=10)
    assert asked["request"]["toolArguments"] == {"command": "echo b >> ran.txt"}


@pytest.mark.parametrize("content", [
    {"minutes": 0}, {"minutes": 10081}, {"minutes": 1.5}, {"minutes": True}, {}, {"minutes": 5, "until": _soon(60)},
    {"until": "2000-01-01T00:00:00Z"}, {"until": _soon(8 * 24 * 3600)}, {"until": "soon"}])
def test_a_time_boxed_scope_needs_one_end_within_a_week(content: dict[str, object]) -> None:
    with pytest.raises(AppError) as refused:
        parse_decision({"decision": "approve", "scope": "for", **content})
    assert refused.value.code == vocab.INVALID


def _once() -> Any:
    return reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo x >> ran.txt"})), after_tools=Text("done"))


def _crash_after_granting(data_dir: Path, double: OpenAIDouble, *redis: str) -> str:
    """A child process asks, grants for 3 s and is killed -9 before the end; returns the world id."""
    child = subprocess.Popen([sys.executable, str(CHILD), str(data_dir), double.base_url, "granting", *redis],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = child.stdout.readline().decode()  # type: ignore[union-attr]
        assert line.startswith("READY"), child.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the process that granted it, and armed its end
        child.wait(10)
    return line.split()[1]


async def _ends_once(engine: Engine, world: str) -> None:
    [grant] = await engine.store.log.list_open(world, vocab.ALL_GRANTS)
    assert grant["grant"]["expires_at"]
    events = await eventually_async(lambda: engine.events(world, 0, 100_000), timeout=20,
                                    what="the grant's end on the record", accept=lambda events: bool(_expired(events)))
    assert [e["grant_id"] for e in _expired(events)] == [grant["grant"]["id"]]
    assert await engine.grants(world) == []
    assert await engine.store.log.list_open(world, vocab.ALL_GRANTS) == []
    await asyncio.sleep(0.2)  # a second writer would have written by now
    assert len(_expired(await engine.events(world, 0, 100_000))) == 1


async def test_a_time_boxed_grant_ends_after_kill_9_of_its_process_embedded(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(_once())
    world = _crash_after_granting(tmp_path, llm_double)
    engine, close = await open_engine(tmp_path)  # the restart
    try:
        await engine.host(world)
        await _ends_once(engine, world)
    finally:
        await close()


async def test_a_time_boxed_grant_ends_after_kill_9_of_its_process_distributed(
        redis_url: str, tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(_once())
    prefix = unique_name()
    log = await RedisLog.open(redis_url, prefix)
    bus = Bus(RedisBackend(redis_url))
    await bus.connect()
    survivor = Engine(log, bus, data_dir=tmp_path, lease_ttl=1.5)
    await survivor.start()
    try:
        world = _crash_after_granting(tmp_path, llm_double, redis_url, prefix)
        async with survivor.hosting.connected(world):  # someone opens the world on the process still alive
            await _ends_once(survivor, world)
    finally:
        await survivor.stop(grace=1)
        await bus.disconnect()
        await log.close()
        delete_prefix(redis_url, prefix)
