"""Review: a question closed for nobody must not later take a person's answer the tool never got."""
from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from server import vocab
from server.errors import AppError
from server.log.failures import StorageError
from tests.fixtures.engine import Harness, reply_by_turn, tool_calls
from tests.test_mcp_elicitation import TROUBLE, _answer


async def test_a_question_closed_for_nobody_during_an_outage_is_not_answered_by_a_person_after_it(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    await harness.make_world("alice", approval_timeout=1, mcp_servers=[
        {"name": "t", "command": sys.executable, "args": [TROUBLE], "tools": {"book": {"approval": "never"}}}])
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__book", {}))))
    # The log is down (Redis gone a few seconds) from the server's closing answer until `back` is set.
    log, refused, back = harness.engine.store.log, [], asyncio.Event()
    append_batch = log.append_batch

    async def outage(world: str, items: Any) -> list[vocab.Event]:
        if not back.is_set() and (refused or any(e.get("elicitation_answer") for e, _ in items)):
            refused.extend(e for e, _ in items)
            raise StorageError("database or disk is full")
        return await append_batch(world, items)
    monkeypatch.setattr(log, "append_batch", outage)
    await harness.say("book")
    [question] = await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    for _ in range(150):  # until the server's closing answer ("cancel" after the timeout) was refused
        if any(e.get("elicitation_answer") for e in refused):
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # the outage goes on a little (shorter than the first retry's delay)
    back.set()  # the log is back; a person answers the question still in the queue
    try:
        await _answer(harness, question, {"action": "accept", "content": {"guests": 2, "email": "a@b.co"}})
    except AppError as exc:
        assert exc.code == vocab.ALREADY_DECIDED
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")), timeout=10)
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == "t__book", timeout=15)
    # The record says what the MCP server got.
    if closed["elicitation_answer"]["action"] == "accept":
        assert result["content"].startswith("booked for 2"), result["content"]
    else:
        assert result["content"] == "not booked: cancel"
