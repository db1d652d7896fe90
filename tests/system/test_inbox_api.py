"""One inbox for every world (issue #31 item 7) over real HTTP and the inbox's socket: each role's inbox,
deciding from it, the worlds list's counts and tab title, and a request arriving live."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2 as httpx
from websockets.asyncio.client import connect

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import client_for, invite, make_world, wait_until
from tests.fixtures.engine import run_on_request
from tests.fixtures.server import ServerProcess

DENY = json.dumps({"decision": "deny", "scope": "once"})


def _ask(owner: httpx.Client, world: str, command: str) -> dict[str, Any]:
    """Have the world's agent ask to run `command`; returns its pending approval."""
    assert owner.post(f"/api/worlds/{world}/messages", json={"content": f"run {command}"}).status_code == 201
    pending: list[dict[str, Any]] = wait_until(lambda: owner.get(f"/api/worlds/{world}/approvals/pending").json(),
                                               what="an approval")
    return pending[0]


def _inbox(client: httpx.Client) -> list[tuple[str, str]]:
    answer = client.get("/api/inbox")
    assert answer.status_code == 200, answer.text
    return [(r["world"], r["request"]["toolArguments"]["command"]) for r in answer.json()["requests"]]


def test_each_role_finds_what_it_can_decide_and_decides_it(server: ServerProcess, owner: httpx.Client,
                                                         llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(run_on_request)
    first, second = make_world(owner, llm_double, "First"), make_world(owner, llm_double, "Second", ("bob",))
    asked = _ask(owner, first, "echo one")
    _ask(owner, second, "echo two")
    assert _inbox(owner) == [(first, "echo one"), (second, "echo two")]
    member, spectator = invite(owner, first, "member", "max"), invite(owner, first, "spectator", "sam")
    with client_for(server, member["token"]) as m, client_for(server, spectator["token"]) as s:
        assert _inbox(m) == [(first, "echo one")]  # only the world of its invite
        assert _inbox(s) == []  # a spectator decides nothing
        [request] = m.get("/api/inbox").json()["requests"]
        assert request["id"] == asked["id"] and request["world_name"] == "First" and request["chat_title"] == "Main"
        decided = m.post(f"/api/worlds/{request['world']}/tool-results",
                         json={"role": "tool", "tool_call_id": request["id"], "content": DENY})
        assert decided.status_code == 201, decided.text
        assert _inbox(m) == []
    assert _inbox(owner) == [(second, "echo two")]
    assert client_for(server).get("/api/inbox").status_code == 401


def test_worlds_list_shows_counts_and_the_total_in_its_title(server: ServerProcess, owner: httpx.Client,
                                                            llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(run_on_request)
    world = make_world(owner, llm_double, "Counted")
    _ask(owner, world, "echo a")
    page = owner.get("/")
    assert page.status_code == 200
    assert "<title>(1) Worlds" in page.text
    assert f'data-pending-world="{world}">1 waiting<' in page.text


async def test_inbox_socket_sends_a_request_arriving_in_another_world(server: ServerProcess, owner: httpx.Client,
                                                                      llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(run_on_request)
    quiet = make_world(owner, llm_double, "Quiet")  # no work yet: not in the work index when the inbox opens
    headers = {"Authorization": f"Bearer {server.token}"}
    async with asyncio.timeout(30), connect(f"{server.ws_url}/inbox/ws", additional_headers=headers) as ws:
        first = json.loads(await ws.recv())
        assert first["type"] == "inbox" and first["total"] == 0
        owner.post(f"/api/worlds/{quiet}/messages", json={"content": "run echo late"})
        while True:
            frame = json.loads(await ws.recv())
            if frame["total"]:
                break
        assert frame["counts"] == {quiet: 1} and "echo late" in frame["html"]
        await ws.send(json.dumps({"type": "decide", "world": quiet, "approval": frame["html"].split(
            'data-approval="')[1].split('"')[0], "choice": "deny"}))
        while frame["total"]:
            frame = json.loads(await ws.recv())
        assert owner.get(f"/api/worlds/{quiet}/approvals/pending").json() == []
