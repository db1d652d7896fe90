"""Bounds on what an untrusted MCP server sends (issue #30): a result is kept up to the world's
`mcp_result_limit` with a note the LLM reads, never stored whole; a call has at most 5 questions open
and a world at most its `elicitation_limit`, the rest declined at once; a call's deadline runs on while
its questions wait."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.errors import AppError
from tests.fixtures.engine import OWNER, Harness, reply_by_turn, tool_calls

TROUBLE = str(Path(__file__).parents[1] / "fixtures" / "mcp_trouble_server.py")
NOTE = re.compile(r"\n\[truncated: (\d+) of (\d+) bytes shown\]$")


def _server(*tools: str) -> list[dict[str, Any]]:
    return [{"name": "t", "command": sys.executable, "args": [TROUBLE],
             "tools": {tool: {"approval": "never"} for tool in tools}}]


async def _result(harness: Harness, tool: str, timeout: float = 30) -> dict[str, Any]:
    [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and e.get("name") == tool, timeout=timeout)
    return result


# The openai SDK posts the next input (over 1 MiB with the result) as raw bytes, and httpx warns that this may
# hold the event loop (issue #30 item 2); the warning is not this test's subject.
@pytest.mark.filterwarnings("ignore:Sending a large body directly with raw bytes:ResourceWarning")
async def test_a_2_mb_result_is_stored_truncated_and_the_llm_reads_that_it_was(harness: Harness) -> None:
    # 2 MB of text is a 4 MB message (the server repeats it as structured content): under the 4 MiB + 64 KiB read.
    await harness.make_world("alice", mcp_servers=_server("huge"))
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__huge", {"size": 2_000_000}))))
    await harness.say("fetch it all")
    result = await _result(harness, "t__huge", timeout=60)
    content = result["content"]
    note = NOTE.search(content)
    assert note is not None, content[-200:]
    assert (int(note[1]), int(note[2])) == (1024 * 1024, 2_000_000)
    assert len(content.encode()) <= 1024 * 1024 + len(note[0])
    await harness.wait_for(lambda e: e.get("role") == "assistant" and str(e.get("content")).startswith("done"),
                           timeout=30)
    [request] = [r for r in harness.double.requests if r.body["messages"][-1]["role"] == "tool"]
    assert NOTE.search(request.body["messages"][-1]["content"])


async def test_a_20_mb_result_is_refused_unread_and_the_server_answers_the_next_call(harness: Harness) -> None:
    await harness.make_world("alice", mcp_servers=_server("huge", "echo"))
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__huge", {"size": 20_000_000}))))
    await harness.say("fetch it all")
    refused = (await _result(harness, "t__huge", timeout=60))["content"]
    bound = 4 * 1024 * 1024 + 64 * 1024  # of the default limit, 1 MiB
    assert "failed on 'huge': MCPError: the MCP server sent a message of " in refused
    assert f"over the {bound} read from it (4 x the world's mcp_result_limit + 64 KiB)" in refused
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__echo", {"text": "after"}))))
    await harness.say("and now?")
    assert (await _result(harness, "t__echo"))["content"] == "after"


async def test_the_result_limit_is_a_world_setting_counting_binary_too(harness: Harness) -> None:
    await harness.make_world("alice", mcp_result_limit=4096, mcp_servers=_server("huge"))
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__huge", {"size": 1000, "image_size": 5000}))))
    await harness.say("fetch")
    content = (await _result(harness, "t__huge"))["content"]
    assert content == "x" * 1000 + "\n[truncated: 1000 of 6030 bytes shown]"  # the image (5000 + 29) did not fit
    for bad in (0, 1023, 16 * 1024 * 1024 + 1, "1MB", True):
        with pytest.raises(AppError, match="mcp_result_limit") as refused:
            await harness.engine.update_world(harness.world, OWNER, settings={"mcp_result_limit": bad})
        assert refused.value.code == vocab.INVALID


async def test_a_call_asking_300_questions_queues_5_and_the_rest_are_declined_at_once(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    await harness.make_world("alice", mcp_timeout=5, mcp_servers=_server("ask_many"))
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__ask_many", {"count": 300}))))
    await harness.say("ask away")
    await harness.wait_for(lambda e: bool(e.get("elicitation")), count=5, timeout=30)
    assert len(await harness.engine.elicitations.pending(harness.world)) == 5
    # Nobody answers: the call ends at its deadline, with never more than 5 questions put to people.
    assert "timed out after 5s" in (await _result(harness, "t__ask_many"))["content"]
    assert len([e for e in await harness.events() if e.get("elicitation")]) == 5
    assert any("declined a question: this call already has 5 questions open" in r.getMessage()
               for r in caplog.records)
    await harness.wait_for(lambda e: bool(e.get("elicitation_answer")), count=5, timeout=10)
    assert await harness.engine.elicitations.pending(harness.world) == []


async def test_a_world_has_at_most_its_elicitation_limit_open(harness: Harness) -> None:
    await harness.make_world("alice", elicitation_limit=2, mcp_timeout=2, mcp_servers=_server("ask_many"))
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__ask_many", {"count": 4}))))
    await harness.say("ask away")
    await harness.wait_for(lambda e: bool(e.get("elicitation")), count=2, timeout=30)
    assert "timed out" in (await _result(harness, "t__ask_many"))["content"]
    assert len([e for e in await harness.events() if e.get("elicitation")]) == 2
    with pytest.raises(AppError, match="elicitation_limit"):
        await harness.engine.update_world(harness.world, OWNER, settings={"elicitation_limit": 0})


async def test_a_call_whose_question_is_never_answered_ends_at_its_deadline(harness: Harness) -> None:
    await harness.make_world("alice", mcp_timeout=1, mcp_servers=_server("book"))
    harness.double.respond_with(reply_by_turn(lambda: tool_calls(("t__book", {}))))
    await harness.say("book")
    await harness.wait_for(lambda e: bool(e.get("elicitation")), timeout=15)
    result = await _result(harness, "t__book", timeout=10)  # not the 600 s a question waits for a person
    assert "timed out after 1s" in result["content"]
    [closed] = await harness.wait_for(lambda e: bool(e.get("elicitation_answer")), timeout=10)
    assert closed["elicitation_answer"]["action"] == "cancel"
    assert await harness.engine.elicitations.pending(harness.world) == []
