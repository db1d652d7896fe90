"""Retry (#14 item 7): a failed or stopped reply is asked again — the same input, a new LLM call — by a
member, never by a spectator, and the retry is on the record."""
from __future__ import annotations

from typing import Any

import pytest

from server import vocab
from server.errors import AppError
from server.testing.openai_double import Stall, Status, Text
from tests.fixtures.engine import MEMBER, SPECTATOR, Harness
from tests.fixtures.eventually import eventually_async


async def _requests(harness: Harness, n: int) -> None:
    await eventually_async(lambda: len(harness.double.requests), accept=lambda count: count >= n, timeout=10,
                           what=f"{n} LLM requests")


def _input(harness: Harness, n: int) -> list[dict[str, Any]]:
    """The messages of the n-th LLM request (1-based)."""
    messages: list[dict[str, Any]] = harness.double.requests[n - 1].body["messages"]
    return messages


async def test_a_failed_reply_is_retried_with_the_same_input(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Status(401, "Incorrect API key provided"), Text("second try worked"))
    await harness.say("hello?")
    await harness.idle()
    [error] = [e for e in await harness.events() if e["kind"] == vocab.AGENT_ERROR]
    retried = await harness.engine.retry(harness.world, MEMBER, "alice", error["seq"])
    assert retried["kind"] == vocab.TURN_RETRIED and retried["retry_of"] == error["seq"]
    assert retried["sender"] == "human:max" and retried["chat"] == error["chat"]
    await harness.wait_for(lambda e: e.get("content") == "second try worked")
    await harness.idle()
    assert len(harness.double.requests) == 2 and _input(harness, 2) == _input(harness, 1)
    audit = await harness.engine.audit(harness.world)
    assert any(entry["action"] == "turn_retried" and entry["who"] == "human:max" for entry in audit)

    # Once: the same failure cannot be retried again, and a person's message is no target (a reply that did
    # not fail is regenerated: test_engine_versions.py).
    with pytest.raises(AppError) as again:
        await harness.engine.retry(harness.world, MEMBER, "alice", error["seq"])
    assert again.value.code in (vocab.CONFLICT, vocab.ALREADY_DECIDED)
    [said] = [e for e in await harness.events() if e.get("role") == "user"]
    with pytest.raises(AppError) as not_a_reply:
        await harness.engine.retry(harness.world, MEMBER, "alice", said["seq"])
    assert not_a_reply.value.code == vocab.INVALID


async def test_a_stopped_reply_is_retried_without_its_partial_text(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Stall(after_chunks=2, then=Text("never finished")), Text("the whole answer"))
    await harness.say("tell me everything")
    await _requests(harness, 1)
    await eventually_async(lambda: harness.engine.cancel_turn(harness.world, MEMBER, "alice"), timeout=10,
                           what="the call to be in flight, so that it can be stopped")
    [stopped] = await harness.wait_for(lambda e: bool(e.get("stopped")))
    await harness.idle()
    await harness.engine.retry(harness.world, MEMBER, "alice", stopped["seq"])
    await harness.wait_for(lambda e: e.get("content") == "the whole answer")
    assert _input(harness, 2) == _input(harness, 1)  # the stopped text is not in the new call's input


async def test_a_spectator_cannot_retry_and_is_counted_not_logged(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Status(401))
    await harness.say("hello?")
    await harness.idle()
    [error] = [e for e in await harness.events() if e["kind"] == vocab.AGENT_ERROR]
    before = len(await harness.events())
    refused = harness.engine.metrics.refusals.labels(vocab.SPECTATOR, vocab.FORBIDDEN)
    counted = refused._value.get()
    with pytest.raises(AppError) as exc:
        await harness.engine.retry(harness.world, SPECTATOR, "alice", error["seq"])
    assert exc.value.code == vocab.FORBIDDEN
    assert refused._value.get() == counted + 1
    assert len(await harness.events()) == before and len(harness.double.requests) == 1
