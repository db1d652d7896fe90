"""Two real `agent-world serve` processes on one Redis: any process can take any client (docs/protocol.md §1)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import all_events, client_for, invite, make_world
from tests.fixtures.engine import run_on_request
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.storage import delete_prefix, unique_name
from tests.fixtures.ws import is_approval, read_until, replay_and_snapshot, ws_connect
from tests.system.test_session_ends import closed_before_more_news, session_sockets, signed_in


@pytest.fixture
def two_servers(tmp_path: Path, llm_double: OpenAIDouble, redis_url: str) -> Iterator[list[ServerProcess]]:
    """Two server processes sharing one Redis namespace (and the owner token), each with its own data folder."""
    prefix = unique_name()
    args = ["--no-demo", "--redis-url", redis_url, "--redis-prefix", prefix]
    servers: list[ServerProcess] = []
    try:
        servers.append(start_server(tmp_path / "one", llm=llm_double, args=args))
        servers.append(start_server(tmp_path / "two", llm=llm_double, args=args, token=servers[0].token))
        yield servers
    finally:
        for server in servers:
            server.stop()
        delete_prefix(redis_url, prefix)


def _members(frame: dict[str, Any]) -> set[tuple[str, str, int]]:
    return {(m["name"], m["role"], m["connections"]) for m in frame.get("members", ())}


async def _sees_members(ws: Any, snapshot: dict[str, Any], expected: set[tuple[str, str, int]]) -> None:
    """The snapshot lists `expected`, or a later `presence` frame does."""
    if _members(snapshot) != expected:
        await read_until(ws, lambda f: f["type"] == "presence" and _members(f) == expected)


async def test_clients_of_two_servers_share_a_world_its_approvals_and_its_member_list(
        two_servers: list[ServerProcess], llm_double: OpenAIDouble, tmp_path: Path) -> None:
    one, two = two_servers
    llm_double.respond_with(run_on_request)
    with client_for(one, one.token) as owner:
        world = make_world(owner, llm_double)
        member = invite(owner, world, "member", "max")
    everyone = {("owner", "owner", 1), ("max", "member", 1)}
    async with ws_connect(one, world, one.token) as ws_one, ws_connect(two, world, member["token"]) as ws_two:
        for ws in (ws_one, ws_two):  # each server lists the member connected through the other
            await _sees_members(ws, (await replay_and_snapshot(ws))[1], everyone)
        # The member asks through server two; whichever server runs alice, both clients see the request.
        await ws_two.send(json.dumps({"type": "say", "content": "@alice run echo x >> ran.txt", "ref": "s"}))
        approval = (await read_until(ws_one, is_approval))[-1]["event"]
        assert (await read_until(ws_two, is_approval))[-1]["event"] == approval
        decision = {"role": "tool", "tool_call_id": approval["tool_calls"][0]["id"],
                    "content": json.dumps({"decision": "approve", "scope": "once"})}
        await ws_two.send(json.dumps({"type": "tool_result", "message": decision, "ref": "d"}))
        applied = (await read_until(ws_two, lambda f: f.get("ref") == "d"))[-1]
        await ws_one.send(json.dumps({"type": "tool_result", "message": decision, "ref": "again"}))
        refused = (await read_until(ws_one, lambda f: f.get("ref") == "again"))[-1]
        done = lambda f: f["type"] == "event" and f["event"].get("content") == "done"  # noqa: E731
        for ws in (ws_one, ws_two):
            await read_until(ws, done)
    assert applied["type"] == "ack" and (refused["type"], refused["code"]) == ("error", "already_decided")
    # Each process has its own data folder here, so the workspace that ran it is one of the two.
    runs = [(server.data_dir / "workspaces" / world / "ran.txt") for server in two_servers]
    assert [r.read_text() for r in runs if r.exists()] == ["x\n"], "the command ran exactly once, in one process"
    with client_for(two, two.token) as owner_two:
        events = all_events(owner_two, world)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert len([e for e in events if e.get("role") == "tool" and not e.get("decision")]) == 1


async def test_a_killed_server_drops_out_of_the_member_list_seen_through_the_other(
        two_servers: list[ServerProcess], llm_double: OpenAIDouble) -> None:
    one, two = two_servers
    with client_for(one, one.token) as owner:
        world = make_world(owner, llm_double, agents=())
        member = invite(owner, world, "member", "max")
    async with ws_connect(one, world, member["token"]) as ws_one, ws_connect(two, world, two.token) as ws_two:
        await replay_and_snapshot(ws_one)
        await _sees_members(ws_two, (await replay_and_snapshot(ws_two))[1],
                            {("owner", "owner", 1), ("max", "member", 1)})
        one.kill()  # no goodbye: the others notice the silence
        alone = {("owner", "owner", 1)}
        await read_until(ws_two, lambda f: f["type"] == "presence" and _members(f) == alone, timeout=15)


async def test_a_logout_through_one_process_closes_the_sockets_held_by_another(
        two_servers: list[ServerProcess], llm_double: OpenAIDouble) -> None:
    one, two = two_servers
    with client_for(one, one.token) as owner:
        world = make_world(owner, llm_double, agents=())
        member = invite(owner, world, "member", "mia")
        with signed_in(two, world, member["token"]) as browser:
            # The session is shared through Redis: its sockets are on server two, its logout on server one.
            async with session_sockets(two, world, browser.cookies["aw_session"]) as sockets:
                with client_for(one) as through_one:
                    through_one.cookies = browser.cookies
                    logout = through_one.post("/logout", headers={"Origin": one.url})
                assert logout.status_code == 200
                await closed_before_more_news(owner, world, sockets)
