"""Access control (docs/protocol.md §2): tokens, invites, the session cookie and each role's rights, over real HTTP."""
from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2 as httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import all_events, client_for, error_of, invite, make_world, sign_in, wait_until
from tests.fixtures.engine import reply_by_turn, tool_calls
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.ws import frames_until_closed, read_until, ws_connect

APPROVE = json.dumps({"decision": "approve", "scope": "once"})


def _pending_approval(owner: httpx.Client, llm: OpenAIDouble, world: str) -> dict[str, Any]:
    """Have alice ask to run a shell command; returns the pending approval."""
    llm.respond_with(reply_by_turn(tool_calls(("shell_exec", {"command": "touch ran-by-tool"}))))
    assert owner.post(f"/api/worlds/{world}/messages", json={"content": "run it"}).status_code == 201
    pending: list[dict[str, Any]] = wait_until(lambda: owner.get(f"/api/worlds/{world}/approvals/pending").json(),
                                               what="an approval")
    return pending[0]


def _refused(response: httpx.Response, status: int = 403, code: str = "forbidden") -> bool:
    return response.status_code == status and error_of(response) == code


def test_calls_without_valid_credentials_get_401(server: ServerProcess, llm_double: OpenAIDouble) -> None:
    with client_for(server, server.token) as owner:
        world = make_world(owner, llm_double, agents=())
    calls = [("GET", "/api/worlds"), ("GET", "/api/me"), ("GET", f"/api/worlds/{world}"),
             ("GET", f"/api/worlds/{world}/events"), ("POST", f"/api/worlds/{world}/messages"),
             ("POST", f"/api/worlds/{world}/tool-results"), ("POST", f"/api/worlds/{world}/invites")]
    for credentials in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": f"Basic {server.token}"},
                        {"Cookie": "aw_session=forged.value.here"}):
        for method, path in calls:
            response = httpx.request(method, server.url + path, headers=credentials, json={"content": "x"})
            assert _refused(response, 401, "unauthorized"), (credentials, path, response.text)
    with client_for(server, server.token) as owner:
        assert len(all_events(owner, world)) == 2  # nothing was written


def test_owner_can_manage_send_and_decide(owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    assert owner.patch(f"/api/worlds/{world}", json={"name": "Renamed", "settings": {"turn_limit": 3}}).json()[
        "settings"]["turn_limit"] == 3
    assert owner.patch(f"/api/worlds/{world}/agents/alice", json={"system_prompt": "be brief"}).status_code == 200
    chat = owner.post(f"/api/worlds/{world}/chats", json={"title": "Second"})
    assert chat.status_code == 201 and chat.json()["title"] == "Second"
    approval = _pending_approval(owner, llm_double, world)
    cancelled = owner.post(f"/api/worlds/{world}/agents/alice/cancel")
    assert cancelled.json() == {"agent": "alice", "cancelled": 1}
    assert owner.get(f"/api/worlds/{world}/approvals/pending").json() == []
    late = owner.post(f"/api/worlds/{world}/tool-results",
                      json={"role": "tool", "tool_call_id": approval["id"], "content": APPROVE})
    assert _refused(late, 409, "already_decided")
    rule = owner.post(f"/api/worlds/{world}/rules", json={"tool": "shell_exec", "effect": "allow"}).json()
    assert [r["id"] for r in owner.get(f"/api/worlds/{world}/rules").json()] == [rule["id"]]
    assert owner.delete(f"/api/worlds/{world}/rules/{rule['id']}").status_code == 204
    assert owner.get(f"/api/worlds/{world}/rules").json() == []
    assert owner.delete(f"/api/worlds/{world}/agents/alice").status_code == 204
    assert owner.delete(f"/api/worlds/{world}").status_code == 204
    assert _refused(owner.get(f"/api/worlds/{world}"), 404, "not_found")
    assert world not in [w["id"] for w in owner.get("/api/worlds").json()]


def test_member_can_send_and_decide_but_not_manage(server: ServerProcess, owner: httpx.Client,
                                                   llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    approval = _pending_approval(owner, llm_double, world)
    made = invite(owner, world, "member", name="max")
    with client_for(server, made["token"]) as member:
        assert member.get("/api/me").json() == {"name": "max", "owner": False, "world": world, "role": "member"}
        assert member.get(f"/api/worlds/{world}").json()["me"] == {"name": "max", "role": "member"}
        decided = member.post(f"/api/worlds/{world}/tool-results",
                              json={"role": "tool", "tool_call_id": approval["id"], "content": APPROVE})
        assert decided.status_code == 201 and decided.json()["sender"] == "human:max"
        sent = member.post(f"/api/worlds/{world}/messages", json={"content": "thanks"})
        assert sent.status_code == 201 and sent.json()["sender"] == "human:max"
        forbidden = [
            member.post("/api/worlds", json={"name": "Mine"}),
            member.patch(f"/api/worlds/{world}", json={"name": "Taken"}),
            member.delete(f"/api/worlds/{world}"),
            member.post(f"/api/worlds/{world}/agents", json={"name": "bob"}),
            member.patch(f"/api/worlds/{world}/agents/alice", json={"model": "x"}),
            member.delete(f"/api/worlds/{world}/agents/alice"),
            member.post(f"/api/worlds/{world}/invites", json={"role": "member"}),
        ]
        assert all(_refused(r) for r in forbidden), [r.text for r in forbidden]
        started = member.post(f"/api/worlds/{world}/chats", json={})  # members may start chats (not rename them)
        assert started.status_code == 201, started.text
    info = owner.get(f"/api/worlds/{world}").json()
    assert info["name"] == "Lab" and [a["name"] for a in info["agents"]] == ["alice"] and len(info["chats"]) == 2


def test_a_members_refusal_to_add_an_agent_is_on_the_record(server: ServerProcess, owner: httpx.Client,
                                                             llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    with client_for(server, invite(owner, world, "member", name="max")["token"]) as member:
        assert _refused(member.post(f"/api/worlds/{world}/agents", json={"name": "bob"}))
    refusals = [e for e in owner.get(f"/api/worlds/{world}/audit").json() if e["action"] == "refused"]
    assert [e["message"] for e in refusals] == ["a member may not add agents"]


def test_spectator_can_read_but_not_send_or_decide(server: ServerProcess, owner: httpx.Client,
                                                   llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    approval = _pending_approval(owner, llm_double, world)
    token = invite(owner, world, "spectator")["token"]
    before, pending = all_events(owner, world), owner.get(f"/api/worlds/{world}/approvals/pending").json()
    with client_for(server, token) as spectator:
        assert spectator.get(f"/api/worlds/{world}").status_code == 200
        assert all_events(spectator, world) == before
        assert spectator.get(f"/api/worlds/{world}/approvals/pending").json() == pending
        assert spectator.get(f"/api/worlds/{world}/audit").status_code == 200
        refused = [
            spectator.post(f"/api/worlds/{world}/messages", json={"content": "let me in"}),
            spectator.post(f"/api/worlds/{world}/tool-results",
                           json={"role": "tool", "tool_call_id": approval["id"], "content": APPROVE}),
            spectator.post(f"/api/worlds/{world}/agents/alice/cancel"),
            spectator.post(f"/api/worlds/{world}/rules", json={"tool": "shell_exec", "effect": "allow"}),
            spectator.post(f"/api/worlds/{world}/invites", json={"role": "member"}),
        ]
        assert all(_refused(r) for r in refused), [r.text for r in refused]
    assert all_events(owner, world) == before
    assert owner.get(f"/api/worlds/{world}/approvals/pending").json() == pending
    assert len(llm_double.requests) == 1  # alice was never told the tool ran
    assert not (server.data_dir / "workspaces" / world / "ran-by-tool").exists()


def test_an_invite_to_one_world_gives_nothing_in_another(server: ServerProcess, owner: httpx.Client,
                                                         llm_double: OpenAIDouble) -> None:
    world_a = make_world(owner, llm_double, name="A", agents=())
    world_b = make_world(owner, llm_double, name="B", agents=())
    before_b = all_events(owner, world_b)
    with client_for(server, invite(owner, world_a, "member")["token"]) as member:
        assert [w["id"] for w in member.get("/api/worlds").json()] == [world_a]
        for response in (member.get(f"/api/worlds/{world_b}"), member.get(f"/api/worlds/{world_b}/events"),
                         member.get(f"/api/worlds/{world_b}/approvals/pending"),
                         member.post(f"/api/worlds/{world_b}/messages", json={"content": "hi"}),
                         member.get("/api/worlds/no-such-world")):  # no hint whether a world exists
            assert _refused(response), response.text
        assert member.get("/api/me", params={"world": world_b}).json()["role"] is None
    assert all_events(owner, world_b) == before_b


def test_an_owner_lists_and_revokes_invites_and_a_revoked_one_stops_working(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    kept, revoked = invite(owner, world, "spectator", "sam"), invite(owner, world, "member", "mia")
    listed = owner.get(f"/api/worlds/{world}/invites")
    assert listed.status_code == 200
    assert [(i["id"], i["role"], i["name"], i["by"]) for i in listed.json()] == [
        (kept["id"], "spectator", "sam", "human:owner"), (revoked["id"], "member", "mia", "human:owner")]
    assert kept["token"] not in listed.text and "token_sha256" not in json.dumps(all_events(owner, world))
    with httpx.Client(base_url=server.url, timeout=10) as browser, client_for(server, revoked["token"]) as bearer:
        assert sign_in(browser, revoked["url"]).status_code == 303  # a session cookie from the invite
        assert browser.get("/api/me").json()["role"] == "member"
        assert _refused(bearer.get(f"/api/worlds/{world}/invites"))  # a member may not manage invites
        assert _refused(bearer.delete(f"/api/worlds/{world}/invites/{kept['id']}"))
        assert owner.delete(f"/api/worlds/{world}/invites/{revoked['id']}").status_code == 204
        assert _refused(bearer.get(f"/api/worlds/{world}/events"), 401, "unauthorized")
        assert _refused(browser.get("/api/me"), 401, "unauthorized")  # its cookie ended with it
        assert browser.get(revoked["url"]).status_code == 403
    assert [i["id"] for i in owner.get(f"/api/worlds/{world}/invites").json()] == [kept["id"]]
    again = owner.delete(f"/api/worlds/{world}/invites/{revoked['id']}")
    assert again.status_code == 404 and error_of(again) == "not_found"
    with client_for(server, kept["token"]) as spectator:
        assert spectator.get(f"/api/worlds/{world}/events").status_code == 200
    audit = owner.get(f"/api/worlds/{world}/audit")
    assert {"action": "invite_revoked", "invite_id": revoked["id"], "who": "human:owner"}.items() <= next(
        e for e in audit.json() if e["action"] == "invite_revoked").items()
    assert "token_sha256" not in audit.text


async def test_revoking_an_invite_closes_its_open_sockets(server: ServerProcess, owner: httpx.Client,
                                                          llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    member, other = invite(owner, world, "member", "mia"), invite(owner, world, "member", "max")
    page_url = f"{server.ws_url}/w/{world}/ws"
    async with ws_connect(server, world, member["token"]) as json_socket, \
            ws_connect(server, world, other["token"]) as kept_socket, \
            connect(page_url, additional_headers={"Authorization": f"Bearer {member['token']}"}) as page_socket:
        await read_until(json_socket, lambda f: f["type"] == "snapshot")
        await read_until(kept_socket, lambda f: f["type"] == "snapshot")
        assert (await asyncio.to_thread(owner.delete, f"/api/worlds/{world}/invites/{member['id']}")).status_code == 204
        await frames_until_closed(json_socket)
        assert json_socket.close_code == 1008 and json_socket.close_reason == "invite revoked"
        async with asyncio.timeout(10):
            with contextlib.suppress(ConnectionClosed):
                async for _ in page_socket:
                    pass
        assert page_socket.close_code == 1008
        await kept_socket.send(json.dumps({"type": "resync"}))  # the other member's socket lives on
        await read_until(kept_socket, lambda f: f["type"] == "snapshot")


def test_login_urls_set_a_cookie_that_authenticates(server: ServerProcess, owner: httpx.Client,
                                                    llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    other = make_world(owner, llm_double, name="Other", agents=())
    made = invite(owner, world, "member")
    assert urlsplit(made["url"]).path == "/login" and parse_qs(urlsplit(made["url"]).query) == {
        "world": [world], "token": [made["token"]]}
    with httpx.Client(base_url=server.url, timeout=10) as browser:
        assert made["url"].startswith(f"{server.url}/login?")
        login = sign_in(browser, made["url"])
        assert login.status_code == 303 and login.headers["location"] == f"/w/{world}"
        cookie = login.headers["set-cookie"].lower()
        assert "aw_session=" in cookie and "httponly" in cookie and "samesite=lax" in cookie and "path=/" in cookie
        me = browser.get("/api/me").json()
        # An unnamed invite's name is the same wherever it shows: made, listed, on the login page, signed in.
        assert me["role"] == "member" and me["name"].startswith("guest-") and me["name"] == made["name"]
        assert [i["name"] for i in owner.get(f"/api/worlds/{world}/invites").json()] == [made["name"]]
        assert f"as the member <strong>{made['name']}</strong>" in browser.get(made["url"]).text
        sent = browser.post(f"/api/worlds/{world}/messages", json={"content": "from a browser"})
        assert sent.status_code == 201 and sent.json()["sender"] == f"human:{me['name']}"
        assert _refused(browser.post(f"/api/worlds/{world}/messages", json={"content": "csrf"},
                                     headers={"Origin": "http://127.0.0.1:1"}))
        assert _refused(browser.get(f"/api/worlds/{other}"))
        assert browser.post("/logout").status_code == 200
        assert _refused(browser.get("/api/me"), 401, "unauthorized")

        assert browser.get("/login", params={"world": world, "token": "wrong"}).status_code == 403
        assert browser.get("/login", params={"world": other, "token": made["token"]}).status_code == 403
        as_owner = sign_in(browser, f"{server.url}/login?token={server.token}")
        assert as_owner.status_code == 303 and as_owner.headers["location"] == "/"
    with httpx.Client(base_url=server.url, timeout=10, cookies=browser.cookies) as returning:
        server.restart()  # sessions are kept with the data: they outlive the process
        assert returning.get("/api/me").json() == {"name": "owner", "owner": True, "world": None, "role": "owner"}


def test_one_invite_cannot_meet_a_two_person_rule_from_several_sessions(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    # Found by review: each login of an unnamed invite got a new guest name, and names were what the
    # rule counted, so one person with one link asked for a call and approved it from other cookie jars.
    world = make_world(owner, llm_double)
    rule = owner.post(f"/api/worlds/{world}/rules",
                      json={"tool": "shell_exec", "effect": "ask", "approvals_required": 2})
    assert rule.status_code == 201, rule.text
    asker, helper = invite(owner, world, "member"), invite(owner, world, "member")  # unnamed: guests
    with client_for(server, asker["token"]) as bearer:
        approval = _pending_approval(bearer, llm_double, world)
        bearer_name = bearer.get("/api/me").json()["name"]

    def approve_from_a_new_session(made: dict[str, Any]) -> tuple[str, httpx.Response]:
        with httpx.Client(base_url=server.url, timeout=10) as browser:
            assert sign_in(browser, made["url"]).status_code == 303
            return browser.get("/api/me").json()["name"], browser.post(
                f"/api/worlds/{world}/tool-results", headers={"Origin": server.url},
                json={"role": "tool", "tool_call_id": approval["id"], "content": APPROVE})

    for _ in range(2):  # every session of the asker's invite is the asker, under the bearer's name
        name, decided = approve_from_a_new_session(asker)
        assert name == bearer_name and _refused(decided), decided.text
    helper_name, decided = approve_from_a_new_session(helper)
    assert decided.status_code == 201 and helper_name != bearer_name, decided.text
    name, again = approve_from_a_new_session(helper)
    assert name == helper_name and _refused(again, 409, "already_decided"), again.text
    [still] = owner.get(f"/api/worlds/{world}/approvals/pending").json()
    assert still["approved_by"] == [f"human:{helper_name}"]
    assert "invite:" not in json.dumps(all_events(owner, world))  # who is behind a name stays on the server
    assert owner.post(f"/api/worlds/{world}/tool-results",
                      json={"role": "tool", "tool_call_id": approval["id"], "content": APPROVE}).status_code == 201
    wait_until(lambda: [e for e in all_events(owner, world) if e.get("role") == "tool"
                        and e.get("name") == "shell_exec"], what="the approved call's result")


def test_tokens_never_appear_in_the_server_log(tmp_path: Path, llm_double: OpenAIDouble) -> None:
    server = start_server(tmp_path / "data", llm=llm_double, extra_env={"AGENT_WORLD_LOG_LEVEL": "debug"})
    try:
        with client_for(server, server.token) as owner:
            world = make_world(owner, llm_double, agents=())
            made = invite(owner, world, "spectator")
            httpx.get(f"{server.url}/login", params={"world": world, "token": made["token"]})
            httpx.get(f"{server.url}/login", params={"token": server.token})
            httpx.get(f"{server.url}/login", params={"token": "guessed-token-123"})
            httpx.get(f"{server.url}/api/worlds", headers={"Authorization": f"Bearer {made['token']}"})
            httpx.get(f"{server.url}/api/worlds", headers={"Authorization": "Bearer guessed-token-456"})
    finally:
        server.stop()
    log = server.log()
    assert "Agent World is serving" in log
    for secret in (server.token, made["token"], "guessed-token-123", "guessed-token-456"):
        assert secret not in log


async def test_thirty_refused_frames_from_a_spectator_add_no_event_on_any_path(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    """HTTP, the JSON WebSocket and the page's socket refuse a spectator through the engine's one path:
    each refusal is answered and counted, none is written."""
    world = make_world(owner, llm_double)
    approval = _pending_approval(owner, llm_double, world)
    token = invite(owner, world, "spectator")["token"]
    before = all_events(owner, world)
    decide = {"role": "tool", "tool_call_id": approval["id"], "content": APPROVE}
    with client_for(server, token) as spectator:
        for _ in range(10):
            assert _refused(spectator.post(f"/api/worlds/{world}/tool-results", json=decide))
    async with ws_connect(server, world, token) as ws:
        await read_until(ws, lambda f: f["type"] == "snapshot")
        for i in range(10):
            frame = {"type": "tool_result", "message": decide, "ref": f"r{i}"} if i % 2 else \
                {"type": "say", "content": "let me in", "ref": f"r{i}"}
            await ws.send(json.dumps(frame))
            [error] = [f for f in await read_until(ws, lambda f: f["type"] == "error") if f["type"] == "error"]
            assert error["code"] == "forbidden" and error["ref"] == f"r{i}"
    page_url = f"{server.ws_url}/w/{world}/ws?chat=main&after=0"
    async with connect(page_url, additional_headers={"Authorization": f"Bearer {token}"}) as page:
        for _ in range(10):
            await page.send(json.dumps({"type": "tool_result", "message": decide}))
        async with asyncio.timeout(10):
            refusals = 0
            while refusals < 10:
                refusals += (await page.recv(decode=True)).count("may not decide")
    assert all_events(owner, world) == before
    assert owner.get(f"/api/worlds/{world}/approvals/pending").json() == [approval]
    metrics = owner.get("/metrics").text
    refused = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("agent_world_refusals_total{") and 'role="spectator"' in line)
    assert refused == 30
