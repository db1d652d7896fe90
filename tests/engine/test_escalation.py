"""Escalation (`escalate_after`, `escalate_to`): a request unanswered for N minutes is escalated once, the
chat says so, webhooks send it and the hook hears it; its timeout still denies it later; and the
escalation holds after kill -9 of the process that armed it (embedded: a restart; distributed: another
engine on Redis)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from server import vocab
from server.bus import Bus
from server.bus.redis import RedisBackend
from server.engine.engine import Engine
from server.errors import AppError
from server.log.redis.log import RedisLog
from server.testing.openai_double import OpenAIDouble
from server.vocab import Event
from tests.fixtures import webhook_receiver
from tests.fixtures.engine import OWNER, Harness, open_engine, run_on_request
from tests.fixtures.eventually import eventually_async
from tests.fixtures.storage import delete_prefix, unique_name
from tests.fixtures.webhook_receiver import Receiver

receiver = webhook_receiver.receiver  # the fixture

CHILD = Path(__file__).parents[1] / "fixtures" / "escalation_child.py"


def _escalated(events: list[Event]) -> list[Event]:
    return [e for e in events if e.get("kind") == vocab.APPROVAL_ESCALATED]


async def test_a_request_waiting_past_escalate_after_is_escalated_once_then_still_times_out(
        harness: Harness, receiver: Receiver) -> None:
    heard: list[tuple[str, Event]] = []

    async def push(world: str, event: Event) -> None:  # what the web push channel plugs in
        heard.append((world, event))
    harness.engine.escalations.on_escalated.append(push)
    await harness.make_world("alice", escalate_after=0.02, escalate_to=["owner", "max"], approval_timeout=4,
                             webhooks=[{"url": receiver.url, "allow_private": True, "events": ["escalation"]}])
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    [pending] = await harness.wait_pending(1)
    [escalated] = await harness.wait_for(lambda e: e.get("kind") == vocab.APPROVAL_ESCALATED, timeout=10)
    assert escalated["approval_id"] == pending["id"] and escalated["to"] == ["owner", "max"]
    [notice] = [e for e in await harness.events() if e.get("kind") == vocab.NOTICE and "escalated" in e["text"]]
    assert notice["text"] == "alice's request to run shell_exec has waited 0.02 minutes: escalated to owner, max"
    assert notice["chat"] == pending["chat"]
    assert [w for w, _ in heard] == [harness.world] and heard[0][1]["approval_id"] == pending["id"]
    assert await harness.engine.pending_approvals(harness.world)  # still pending: escalation decides nothing
    await harness.wait_for(lambda e: e.get("kind") == vocab.WEBHOOK_DELIVERED, timeout=10)
    assert receiver.got[0].json()["type"] == "approval.escalated"
    assert receiver.got[0].json()["approval"]["to"] == ["owner", "max"]
    # The timeout still denies it later.
    [denied] = await harness.wait_for(lambda e: (e.get("decision") or {}).get("timeout"), timeout=10)
    assert denied["tool_call_id"] == pending["id"]
    # Arming again (a process hosting it anew) escalates nothing twice.
    assert not await harness.engine.escalations.escalate(harness.world, pending["id"])
    assert len(_escalated(await harness.events())) == 1
    audit = [a for a in await harness.engine.audit(harness.world) if a["action"] == vocab.APPROVAL_ESCALATED]
    assert audit[0]["approval_id"] == pending["id"] and audit[0]["to"] == ["owner", "max"]


async def test_a_request_decided_in_time_is_never_escalated(harness: Harness) -> None:
    await harness.make_world("alice", escalate_after=0.01)
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    [pending] = await harness.wait_pending(1)
    await harness.decide(pending["id"], "deny")
    assert not await harness.engine.escalations.escalate(harness.world, pending["id"])
    await harness.idle(timeout=10)
    assert _escalated(await harness.events()) == []


@pytest.mark.parametrize(("settings", "message"), [
    ({"escalate_after": 0}, "escalate_after must be a number of minutes above 0"),
    ({"escalate_after": "10"}, "escalate_after must be a number of minutes above 0"),
    ({"escalate_to": "owner"}, "escalate_to must be a list of at most 20 names"),
])
async def test_bad_escalation_settings_are_refused(harness: Harness, settings: dict[str, object], message: str) -> None:
    await harness.make_world("alice")
    with pytest.raises(AppError) as refused:
        await harness.engine.update_world(harness.world, OWNER, settings=settings)
    assert message in refused.value.message


def _crash_while_pending(data_dir: Path, double: OpenAIDouble, *redis: str) -> str:
    """The child asks, arms the escalation and is killed -9 before it is due; returns the world id."""
    child = subprocess.Popen([sys.executable, str(CHILD), str(data_dir), double.base_url, *redis],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = child.stdout.readline().decode()  # type: ignore[union-attr]
        assert line.startswith("READY"), child.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the process that armed it
        child.wait(10)
    return line.split()[1]


async def _escalated_once(engine: Engine, world: str) -> None:
    [pending] = await engine.pending_approvals(world)
    events = await eventually_async(lambda: engine.events(world, 0, 100_000), timeout=20,
                                    what="the escalation on the record", accept=lambda e: bool(_escalated(e)))
    assert [e["approval_id"] for e in _escalated(events)] == [pending["id"]]
    assert await engine.pending_approvals(world)
    assert not await engine.escalations.escalate(world, pending["id"])  # a second writer writes nothing
    assert len(_escalated(await engine.events(world, 0, 100_000))) == 1


async def test_an_escalation_holds_after_kill_9_of_its_process_embedded(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(run_on_request)
    world = _crash_while_pending(tmp_path, llm_double)
    engine, close = await open_engine(tmp_path)  # the restart: the world has work, so it is hosted
    try:
        await _escalated_once(engine, world)
    finally:
        await close()


async def test_an_escalation_holds_after_kill_9_of_its_process_distributed(
        redis_url: str, tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(run_on_request)
    prefix = unique_name()
    log = await RedisLog.open(redis_url, prefix)
    bus = Bus(RedisBackend(redis_url))
    await bus.connect()
    survivor = Engine(log, bus, data_dir=tmp_path / "survivor", lease_ttl=1.5)
    await survivor.start()
    try:
        world = _crash_while_pending(tmp_path, llm_double, redis_url, prefix)
        await _escalated_once(survivor, world)
    finally:
        await survivor.stop(grace=1)
        await bus.disconnect()
        await log.close()
        delete_prefix(redis_url, prefix)
