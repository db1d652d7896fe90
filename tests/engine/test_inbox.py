"""One inbox for every world (issue #31 item 7), through the engine: what each role finds in it, and deciding there."""
from __future__ import annotations

import json

from server import vocab
from server.engine.approvals.inbox import inbox, pending_counts, worlds_with_requests
from server.redact import REDACTED
from tests.fixtures.engine import MEMBER, OWNER, SPECTATOR, Harness, run_on_request

SECRET = "sk-proj-abcdefghijklmnopqrstuvwxyz123456"


async def _two_worlds_asking(harness: Harness) -> tuple[str, str]:
    """Two worlds, each with a request waiting: the first world's arrived first."""
    harness.double.respond_with(run_on_request)
    first = await harness.make_world("alice")
    await harness.say(f"run echo {SECRET}")
    await harness.wait_pending(1)
    second = await harness.make_world("bob")
    await harness.say("run echo two")
    await harness.wait_pending(1)
    return first, second


async def test_owner_inbox_lists_every_world_oldest_first_redacted(harness: Harness) -> None:
    first, second = await _two_worlds_asking(harness)
    quiet = await harness.make_world("carol")  # no request: not in the inbox, nor its counts
    assert quiet not in await pending_counts(harness.engine)
    worlds = await worlds_with_requests(harness.engine)
    assert {first, second} <= set(worlds)
    entries = await inbox(harness.engine, {w: OWNER for w in worlds})
    assert [(e["world"], e["agent"]) for e in entries] == [(first, "alice"), (second, "bob")]
    assert entries[0]["world_name"].startswith("World ") and entries[0]["chat_title"] == "Main"
    arguments = entries[0]["request"]["toolArguments"]["command"]
    assert SECRET not in json.dumps(entries) and REDACTED in arguments  # as every event leaving the server
    assert await pending_counts(harness.engine) == {first: 1, second: 1}


async def test_spectator_inbox_has_no_decidable_requests(harness: Harness) -> None:
    first, _ = await _two_worlds_asking(harness)
    assert await inbox(harness.engine, {first: SPECTATOR}) == []
    [entry] = await inbox(harness.engine, {first: MEMBER})
    assert entry["world"] == first


async def test_deciding_from_the_inbox_empties_it(harness: Harness) -> None:
    first, second = await _two_worlds_asking(harness)
    entries = await inbox(harness.engine, {first: MEMBER, second: MEMBER})
    for entry in entries:
        content = json.dumps({"decision": vocab.DENY, "scope": "once"})
        await harness.engine.submit_tool_result(entry["world"], MEMBER,
                                                {"role": "tool", "tool_call_id": entry["id"], "content": content})
    assert await inbox(harness.engine, {first: MEMBER, second: MEMBER}) == []
    assert await pending_counts(harness.engine) == {}
