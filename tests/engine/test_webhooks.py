"""Outgoing webhooks (docs/notifications.md) against a real HTTP receiver on loopback: signed, retried after a
500, Slack's shape, redacted, claimed once, on the record; a loopback target refused without `allow_private`; and
a delivery whose process is killed -9 mid-retry finished by another (embedded: a restart; distributed: another
engine on Redis)."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from server import events, vocab
from server.bus import Bus
from server.bus.redis import RedisBackend
from server.engine.engine import Engine
from server.errors import AppError
from server.log import Close, Open
from server.log.redis.log import RedisLog
from server.testing.openai_double import OpenAIDouble
from server.webhooks.signing import HEADER, verify
from tests.fixtures import webhook_receiver
from tests.fixtures.engine import OWNER, Harness, open_engine, run_on_request
from tests.fixtures.eventually import eventually_async
from tests.fixtures.storage import delete_prefix, unique_name
from tests.fixtures.webhook_receiver import Receiver

receiver = webhook_receiver.receiver  # the fixture

SECRET = "whsec_0123456789abcdef0123456789"
CHILD = Path(__file__).parents[1] / "fixtures" / "webhook_child.py"


def _hook(receiver: Receiver, **more: Any) -> dict[str, Any]:
    return {"url": receiver.url, "allow_private": True, **more}


async def _outcomes(harness: Harness, count: int = 1) -> list[vocab.Event]:
    return await harness.wait_for(lambda e: e.get("kind") in (vocab.WEBHOOK_DELIVERED, vocab.WEBHOOK_FAILED),
                                  count=count, timeout=20)


async def test_a_request_is_posted_signed_and_its_delivery_is_on_the_record(
        harness: Harness, receiver: Receiver) -> None:
    await harness.make_world("alice", webhooks=[_hook(receiver, secret=SECRET, events=["request"])])
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    [pending] = await harness.wait_pending(1)
    [outcome] = await _outcomes(harness)
    [got] = receiver.got
    assert verify(SECRET, got.headers[HEADER], got.body, now=int(time.time()))
    assert not verify("wrong-secret-wrong-secret", got.headers[HEADER], got.body, now=int(time.time()))
    body = got.json()
    assert body["type"] == "approval.requested" and body["world"] == harness.world
    assert body["approval"]["id"] == pending["id"] and body["approval"]["tool"] == "shell_exec"
    assert body["approval"]["arguments"] == {"command": "echo hi"}
    assert got.headers["X-Agent-World-Event"] == "approval.requested"
    assert outcome["kind"] == vocab.WEBHOOK_DELIVERED and outcome["status"] == 200 and outcome["attempts"] == 1
    assert outcome["target"] == "127.0.0.1" and outcome["subject"] == "request"
    # Once, and on the record without the URL: the audit has it; the owner reads the URL masked.
    audit = [a for a in await harness.engine.audit(harness.world) if a["action"] == vocab.WEBHOOK_DELIVERED]
    assert len(audit) == 1 and audit[0]["target"] == "127.0.0.1"
    assert "secretpath" not in str(await harness.engine.events(harness.world))
    hooks = (await harness.engine.get_world(harness.world))["settings"]["webhooks"]
    assert hooks[0]["url"] == "•••" and hooks[0]["secret"] == "•••"
    await harness.decide(pending["id"], "deny")
    await harness.idle(timeout=10)
    assert len(receiver.got) == 1  # it asked for requests only


async def test_a_delivery_answered_500_is_retried_until_it_is_taken(harness: Harness, receiver: Receiver) -> None:
    harness.engine.webhooks.first_wait = 0.05
    receiver.statuses = [500, 503]
    await harness.make_world("alice", webhooks=[_hook(receiver, secret=SECRET)])
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    await harness.wait_pending(1)
    [outcome] = await _outcomes(harness)
    assert outcome["kind"] == vocab.WEBHOOK_DELIVERED and outcome["attempts"] == 3
    assert len(receiver.got) == 3
    assert len({r.headers["X-Agent-World-Delivery"] for r in receiver.got}) == 1  # one delivery, tried again


async def test_a_delivery_failing_past_its_time_is_recorded_as_failed(harness: Harness, receiver: Receiver) -> None:
    harness.engine.webhooks.first_wait, harness.engine.webhooks.retry_for = 0.05, 0.3
    receiver.statuses = [500] * 100
    await harness.make_world("alice", webhooks=[_hook(receiver)])
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    [outcome] = await _outcomes(harness)
    assert outcome["kind"] == vocab.WEBHOOK_FAILED and outcome["status"] == 500 and outcome["error"] == "HTTP 500"
    assert 2 <= outcome["attempts"] == len(receiver.got)


async def test_slack_format_posts_blocks_with_the_request_and_a_link_to_the_queue(
        harness: Harness, receiver: Receiver) -> None:
    harness.engine.webhooks.public_url = "https://agents.example.com"
    await harness.make_world("alice", webhooks=[_hook(receiver, format="slack")])
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    await harness.wait_pending(1)
    await _outcomes(harness)
    message = receiver.got[0].json()
    assert message["text"] == f"alice asks to run shell_exec in {harness.world}"
    first = message["blocks"][0]
    assert first["type"] == "section" and "alice asks to run shell_exec" in first["text"]["text"]
    assert any("echo hi" in b.get("text", {}).get("text", "") for b in message["blocks"])
    [button] = message["blocks"][-1]["elements"]
    assert button["url"] == f"https://agents.example.com/w/{harness.world}"


async def test_secrets_in_a_request_are_redacted_in_what_webhooks_send(harness: Harness, receiver: Receiver) -> None:
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    await harness.make_world("alice", webhooks=[_hook(receiver, events=["request"])])
    harness.double.respond_with(run_on_request)
    await harness.say(f"run curl -H 'Authorization: token {token}' https://api.github.com")
    await harness.wait_pending(1)
    await _outcomes(harness)
    assert token not in receiver.got[0].body.decode()
    assert "curl" in receiver.got[0].json()["approval"]["arguments"]["command"]


async def test_a_loopback_target_is_refused_unless_the_owner_allows_it(harness: Harness, receiver: Receiver) -> None:
    await harness.make_world("alice", webhooks=[{"url": receiver.url}])
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    [outcome] = await _outcomes(harness)
    assert outcome["kind"] == vocab.WEBHOOK_FAILED and outcome["attempts"] == 1
    assert outcome["error"] == ("127.0.0.1 resolves to a loopback address (127.0.0.1): "
                                "set allow_private on this webhook to allow it")
    assert receiver.got == []


async def test_a_name_resolving_to_loopback_is_refused_too(harness: Harness, receiver: Receiver) -> None:
    await harness.make_world("alice", webhooks=[{"url": receiver.url.replace("127.0.0.1", "localhost")}])
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    [outcome] = await _outcomes(harness)
    assert outcome["kind"] == vocab.WEBHOOK_FAILED and "localhost resolves to a loopback address" in outcome["error"]
    assert receiver.got == []


async def test_two_engines_hearing_one_event_send_it_once(harness: Harness, receiver: Receiver) -> None:
    """The claim: every process that hears the event tries it; the delivery's claim lets one send it."""
    await harness.make_world("alice", webhooks=[_hook(receiver, events=["request"])])
    world, webhooks = harness.world, harness.engine.webhooks
    harness.double.respond_with(run_on_request)
    await harness.say("run echo hi")
    [pending] = await harness.wait_pending(1)
    [request] = [e for e in await harness.events() if e.get("seq") == pending["seq"]]
    webhooks.heard(world, request)  # heard again (another process, a catch-up): claimed already
    await _outcomes(harness)
    await eventually_async(lambda: _sending(harness), what="the claims", accept=lambda n: n == 1)
    assert len(receiver.got) == 1


async def _sending(harness: Harness) -> int:
    return len([e for e in await harness.events() if e.get("kind") == vocab.WEBHOOK_SENDING])


@pytest.mark.parametrize(("hooks", "message"), [
    ([{"url": "ftp://example.com/x"}], "webhooks[0].url must be an http(s) URL with a host"),
    ([{"url": "https://example.com", "format": "teams"}], "webhooks[0].format must be one of json, slack"),
    ([{"url": "https://example.com", "events": ["everything"]}], "webhooks[0].events must be a non-empty list"),
    ([{"url": "https://example.com", "to": "x"}], "webhooks[0] has unknown fields: to"),
    ([{"url": "•••"}], "webhooks[0].url is ••• but has no stored value"),
    # The same URL and format twice would be one webhook to the server (one id, one delivery): one was lost.
    ([{"url": "https://example.com/a"}, {"url": "https://example.com/a", "events": ["request"], "secret": "s"}],
     "webhooks[1] has the url and format of webhooks[0]"),
])
async def test_bad_webhooks_are_refused_with_a_clear_error(harness: Harness, hooks: list[Any], message: str) -> None:
    await harness.make_world("alice")
    with pytest.raises(AppError) as refused:
        await harness.engine.update_world(harness.world, OWNER, settings={"webhooks": hooks})
    assert refused.value.code == vocab.INVALID and message in refused.value.message


async def test_a_masked_url_sent_back_keeps_the_stored_one(harness: Harness, receiver: Receiver) -> None:
    await harness.make_world("alice", webhooks=[_hook(receiver, secret=SECRET)])
    shown = (await harness.engine.get_world(harness.world))["settings"]["webhooks"]
    await harness.engine.update_world(harness.world, OWNER, settings={"webhooks": [{**shown[0], "format": "slack"}]})
    [stored] = (await harness.engine.worlds.settings(harness.world))["webhooks"]
    assert stored["url"] == receiver.url and stored["secret"] == SECRET and stored["format"] == "slack"


async def test_a_masked_list_sent_back_without_one_webhook_keeps_each_others_url(
        harness: Harness, receiver: Receiver) -> None:
    first, second = f"{receiver.url}?first", f"{receiver.url}?second"
    await harness.make_world("alice", webhooks=[{**_hook(receiver), "url": first}, {**_hook(receiver), "url": second,
                                                                                     "secret": SECRET}])
    shown = (await harness.engine.get_world(harness.world))["settings"]["webhooks"]
    await harness.engine.update_world(harness.world, OWNER, settings={"webhooks": shown[1:]})
    [kept] = (await harness.engine.worlds.settings(harness.world))["webhooks"]
    assert kept["url"] == second and kept["secret"] == SECRET


async def test_a_watch_whose_take_over_fails_keeps_watching(
        tmp_path: Path, llm_double: OpenAIDouble, caplog: pytest.LogCaptureFixture) -> None:
    # A delivery a dead process left open, whose event cannot be read back: taking it over fails (not with
    # a StorageError). The watch logs it and tries again each lease period; it ends with the delivery.
    engine, close = await open_engine(tmp_path, lease_ttl=0.2)  # the watch looks again every 0.2 s
    try:
        world = await Harness(engine, llm_double).make_world()
        seq, hid = 1_000_000, "hook12345678"
        key = vocab.delivery_key(seq, hid)
        left = events.webhook_outcome("webhook_sending", hid, "hooks.example.com", seq, "request", "dead-process")
        await engine.store.append(world, left, [Open(key)])

        def failures() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage().startswith(f"webhook delivery {key} of {world} not")]
        tried = await eventually_async(failures, timeout=10, what="two failed take-overs", accept=lambda r: len(r) > 1)
        assert all(r.exc_info is not None for r in tried)  # each with its traceback
        done = events.webhook_outcome("webhook_failed", hid, "hooks.example.com", seq, "request", "dead-process")
        await engine.store.append(world, done, [Close(key)])
        assert await engine.store.log.list_open(world, vocab.ALL_DELIVERIES) == []
    finally:
        await close()


async def _crash_while_retrying(receiver: Receiver, data_dir: Path, double: OpenAIDouble,
                                *redis: str) -> tuple[str, str]:
    """The child claims the delivery, is answered 500 and is killed -9 between tries: (world, its instance)."""
    receiver.statuses = [500] * 1000
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), str(data_dir), double.base_url, receiver.url, *redis,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        assert child.stdout is not None and child.stderr is not None
        line = (await asyncio.wait_for(child.stdout.readline(), 30)).decode()
        assert line.startswith("READY"), (await child.stderr.read()).decode()
        await eventually_async(lambda: receiver.got, timeout=20, what="the child's first try")
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the process that had the delivery
        await child.wait()
    receiver.statuses = []  # from now on the receiver takes it
    _, world, instance = line.split()
    return world, instance


async def _finished_once(engine: Engine, world: str, dead: str, receiver: Receiver) -> None:
    def outcomes(events: list[vocab.Event]) -> list[vocab.Event]:
        return [e for e in events if e.get("kind") in (vocab.WEBHOOK_DELIVERED, vocab.WEBHOOK_FAILED)]
    events = await eventually_async(lambda: engine.events(world, 0, 100_000), timeout=30,
                                    what="the delivery's outcome", accept=lambda e: bool(outcomes(e)))
    [outcome] = outcomes(events)
    assert outcome["kind"] == vocab.WEBHOOK_DELIVERED and outcome["instance"] == engine.instance
    [taken] = [e for e in events if e.get("kind") == vocab.WEBHOOK_SENDING and e.get("taken_from")]
    assert taken["taken_from"] == dead and taken["instance"] == engine.instance
    assert len({r.headers["X-Agent-World-Delivery"] for r in receiver.got}) == 1  # one delivery, tried again
    assert receiver.got[-1].json()["type"] == "approval.requested"
    assert await engine.store.log.list_open(world, vocab.ALL_DELIVERIES) == []


async def test_a_delivery_whose_process_dies_mid_retry_is_finished_by_another_embedded(
        tmp_path: Path, llm_double: OpenAIDouble, receiver: Receiver) -> None:
    llm_double.respond_with(run_on_request)
    world, dead = await _crash_while_retrying(receiver, tmp_path, llm_double)
    engine, close = await open_engine(tmp_path)  # the restart: the world has work, so it is hosted
    try:
        await _finished_once(engine, world, dead, receiver)
    finally:
        await close()


async def test_a_delivery_whose_process_dies_mid_retry_is_finished_by_another_distributed(
        redis_url: str, tmp_path: Path, llm_double: OpenAIDouble, receiver: Receiver) -> None:
    llm_double.respond_with(run_on_request)
    prefix = unique_name()
    world, dead = await _crash_while_retrying(receiver, tmp_path, llm_double, redis_url, prefix)
    log = await RedisLog.open(redis_url, prefix)
    bus = Bus(RedisBackend(redis_url))
    await bus.connect()
    survivor = Engine(log, bus, data_dir=tmp_path / "survivor", lease_ttl=1.5)
    await survivor.start()  # while the dead process's lease still runs: it waits for it to lapse
    try:
        await _finished_once(survivor, world, dead, receiver)
    finally:
        await survivor.stop(grace=1)
        await bus.disconnect()
        await log.close()
        delete_prefix(redis_url, prefix)
