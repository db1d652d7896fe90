"""Every way out carries the same public form: the answers to writes, the JSON socket's acks and frames, the
page socket, AG-UI. A token planted in a call's arguments (and in messages, a chat title, a rule, an agent's
prompt) and the private `person` field of people's messages never reach a client, however it asks.

The walk makes each call of `server.api.http.routes()` once, in an order that has something to show at each
step (a pending approval while it is read, a failed reply to retry, a decision that edits only `timeout`),
and keeps each answer; one test per route then reads its answer. A route added without a step here fails
`test_every_api_route_is_walked`.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
import pytest
from starlette.routing import Route

from server.api.http import routes
from server.testing.openai_double import OpenAIDouble, Status, Text
from tests.fixtures.engine import tool_calls
from tests.fixtures.eventually import eventually
from tests.fixtures.inprocess import ORIGIN, Site, site

__all__ = ["site"]

pytestmark = pytest.mark.fast

GHP = "ghp_" + "Zq8rT3vWx9Yb2Nc4Md6Kf1Lh5Pj7Gs0Aa1Bb"  # a GitHub token's shape: the stream hides it
COMMAND = f"curl -H 'Authorization: token {GHP}' https://api.github.com/user"
PRIVATE = ('"person"', '"people"', '"voted"', '"token_sha256"')


@dataclass
class Walk:
    world: str
    answers: dict[str, list[str]] = field(default_factory=dict)  # "METHOD /path" -> each answer's text

    def keep(self, route: str, response: httpx.Response) -> httpx.Response:
        assert response.status_code < 500, (route, response.text)
        self.answers.setdefault(route, []).append(response.text)
        return response


def _reply(body: dict[str, Any]) -> Any:
    """bob asks to run COMMAND (then says done); alice's every call fails at once (a reply to retry)."""
    if body["model"] == "broken":
        return Status(400, "this model always fails")
    if body["messages"][-1]["role"] == "tool":
        return Text("done")
    return tool_calls(("shell_exec", {"command": COMMAND, "timeout": 30}))


@pytest.fixture(scope="module")
def double() -> Iterator[OpenAIDouble]:
    with OpenAIDouble() as llm:
        llm.respond_with(_reply)
        yield llm


@pytest.fixture(scope="module")
def walk(site: Site, double: OpenAIDouble) -> Walk:
    w = f"/api/worlds/{site.world}"
    done = Walk(site.world)

    def call(role: str, method: str, path: str, template: str | None = None, **kwargs: Any) -> httpx.Response:
        return done.keep(f"{method} {template or path}", site.api(role, method, path, **kwargs))

    tw = "/api/worlds/{world}"
    call("owner", "PATCH", f"{w}/agents/alice", f"{tw}/agents/{{name}}",
         json={"base_url": double.base_url, "model": "broken"})
    call("owner", "POST", f"{w}/agents", f"{tw}/agents", json={
        "name": "bob", "provider": "openai", "model": "m", "base_url": double.base_url,
        "system_prompt": f"use {GHP} for GitHub"})
    # The member asks (her message carries her `person`), alice fails, bob asks to run COMMAND.
    said = call("member", "POST", f"{w}/messages", f"{tw}/messages",
                json={"content": f"@alice @bob check {GHP}"}).json()
    failed = eventually(lambda: next((e for e in site.events() if e["kind"] == "agent_error"), None),
                        what="alice's failed reply")
    assert failed is not None  # for the type checker: `eventually` returns a truthy value
    eventually(lambda: site.api("owner", "GET", f"{w}/approvals/pending").json(), what="bob's request")
    call("member", "POST", f"{w}/agents/alice/retry", f"{tw}/agents/{{name}}/retry", json={"seq": failed["seq"]})
    # Every read while the request is pending.
    for role in ("member", "spectator"):
        for path in ("events", "snapshot", "approvals/pending", "client-calls/pending", "audit", "rules",
                     "grants", "chats"):
            call(role, "GET", f"{w}/{path}", f"{tw}/{path}")
        call(role, "GET", f"{w}/search?q=check", f"{tw}/search")
        call(role, "GET", f"{w}/chats/main/export", f"{tw}/chats/{{chat}}/export")
        call(role, "GET", "/api/inbox")
        call(role, "GET", w, tw)
        call(role, "GET", "/api/me")
        call(role, "GET", "/api/worlds")
    [pending] = site.api("owner", "GET", f"{w}/approvals/pending").json()
    rule = call("owner", "POST", f"{w}/rules", f"{tw}/rules",
                json={"tool": "file_read", "match": {"path": f"{GHP}/*"}, "effect": "deny", "reason": GHP}).json()
    call("owner", "DELETE", f"{w}/rules/{rule['id']}", f"{tw}/rules/{{id}}")
    call("owner", "DELETE", f"{w}/grants/grant_none", f"{tw}/grants/{{id}}")
    # The member edits only the timeout: the answer is the decision, with the merged arguments.
    decision = {"decision": "approve", "scope": "once", "arguments": {"timeout": 5}}
    call("member", "POST", f"{w}/tool-results", f"{tw}/tool-results",
         json={"role": "tool", "tool_call_id": pending["id"], "content": json.dumps(decision)})
    call("member", "POST", f"{w}/approvals/decide", f"{tw}/approvals/decide",  # decided already: reported
         json={"ids": [pending["id"]], "decision": "deny"})
    call("member", "POST", f"{w}/chats", f"{tw}/chats", json={"title": f"about {GHP}"})
    call("member", "GET", f"{w}/chats", f"{tw}/chats")
    call("member", "GET", f"{w}/events", f"{tw}/events")
    call("member", "POST", f"{w}/agents/bob/cancel", f"{tw}/agents/{{name}}/cancel")
    call("member", "POST", f"{w}/agents/bob/stop", f"{tw}/agents/{{name}}/stop")
    call("owner", "PATCH", w, tw, json={"name": "Lab"})
    invited = call("owner", "POST", f"{w}/invites", f"{tw}/invites", json={"role": "spectator"}).json()
    call("owner", "GET", f"{w}/invites", f"{tw}/invites")
    call("owner", "DELETE", f"{w}/invites/{invited['id']}", f"{tw}/invites/{{id}}")
    call("owner", "POST", f"{w}/agents", f"{tw}/agents", json={"name": "dave", "provider": "scripted", "model": "m"})
    call("owner", "DELETE", f"{w}/agents/dave", f"{tw}/agents/{{name}}")
    call("member", "POST", f"{w}/chats/main/branch", f"{tw}/chats/{{chat}}/branch",
         json={"seq": said["seq"], "title": f"branch {GHP}"})
    call("member", "POST", f"{w}/messages/{said['seq']}/edit", f"{tw}/messages/{{seq}}/edit",
         json={"content": f"@bob check again {GHP}"})
    other = call("owner", "POST", "/api/worlds", json={"name": "Spare"}).json()
    call("owner", "DELETE", f"/api/worlds/{other['id']}", tw)
    site.sessions["signed-out"] = site._sign_in({"token": site.bearers["member"]})
    done.keep("POST /logout", site.page("signed-out", "POST", "/logout"))
    site.client.cookies.clear()  # the logout's answer clears a cookie that the next request must not send
    return done


def _api_routes() -> list[str]:
    return sorted(f"{method} {route.path}" for route in routes() if isinstance(route, Route)
                  for method in route.methods or () if method != "HEAD")


def test_every_api_route_is_walked(walk: Walk) -> None:
    assert set(_api_routes()) - set(walk.answers) == set()


@pytest.mark.parametrize("route", _api_routes())
def test_no_answer_of_an_api_route_carries_a_hidden_token_or_a_private_field(walk: Walk, route: str) -> None:
    for text in walk.answers.get(route, []):
        assert GHP not in text, (route, text)
        assert not [name for name in PRIVATE if name in text], (route, text)


def test_a_decider_who_edits_only_the_timeout_is_not_answered_with_the_hidden_command(walk: Walk) -> None:
    [answer] = walk.answers["POST /api/worlds/{world}/tool-results"]
    decision = json.loads(answer)["decision"]
    assert decision["arguments"]["timeout"] == 5 and "[redacted]" in decision["arguments"]["command"], decision


def _frames(socket: Any, until: Callable[[str], bool]) -> list[str]:
    """Text frames of `socket` up to and including the first for which `until` holds."""
    seen: list[str] = []
    while not seen or not until(seen[-1]):
        seen.append(socket.receive_text())
    return seen


def test_the_json_sockets_frames_and_acks_carry_no_hidden_token_or_private_field(site: Site, walk: Walk) -> None:
    headers = {"Authorization": f"Bearer {site.bearers['member']}", "Origin": ORIGIN}
    seen: list[str] = []
    # As below: the test client raises the cancel of the socket's handlers as it closes.
    with contextlib.suppress(concurrent.futures.CancelledError), \
            site.client.websocket_connect(f"/api/worlds/{walk.world}/ws?after=0", headers=headers) as socket:
        seen += _frames(socket, lambda text: '"type": "snapshot"' in text or '"type":"snapshot"' in text)
        socket.send_text(json.dumps({"type": "say", "content": f"socket {GHP}", "ref": 7}))
        seen += _frames(socket, lambda text: '"ack"' in text)
        socket.send_text(json.dumps({"type": "resync", "after": 0, "ref": 8}))
        seen += _frames(socket, lambda text: '"ack"' in text)
    assert sum('"ack"' in text for text in seen) == 2  # both answered: what is checked below was all seen
    text = "\n".join(seen)
    assert "socket [redacted]" in text  # its own message came back, hidden
    leaks = [line for line in seen if GHP in line or any(name in line for name in PRIVATE)]
    assert leaks == []


def test_the_page_sockets_frames_carry_no_hidden_token_or_private_field(site: Site, walk: Walk) -> None:
    headers = {"Cookie": f"aw_session={site.sessions['member']}", "Origin": ORIGIN}
    seen: list[str] = []
    # The test client raises the cancel of the socket's handlers as it closes (agents may still be
    # answering over it): what matters is what came before, checked below to be there.
    with contextlib.suppress(concurrent.futures.CancelledError), \
            site.client.websocket_connect(f"/w/{walk.world}/ws", headers=headers) as socket:
        seen.append(socket.receive_text())
        socket.send_text(json.dumps({"type": "say", "content": f"page {GHP}"}))
        seen += _frames(socket, lambda text: "page [redacted]" in text or GHP in text)
    text = "\n".join(seen)
    assert "page [redacted]" in text
    assert GHP not in text and not [name for name in PRIVATE if name in text]


def test_an_agui_run_carries_no_hidden_token_or_private_field(site: Site, walk: Walk) -> None:
    run = {"threadId": "t", "runId": "r", "state": {}, "tools": [], "context": [], "forwardedProps": {},
           "messages": [{"id": "m1", "role": "user", "content": f"@alice agui {GHP}"}]}
    answer = site.api("member", "POST", f"/api/worlds/{walk.world}/agui", json=run,
                      headers={"Accept": "text/event-stream"})
    assert answer.status_code == 200, answer.text
    assert "agui [redacted]" in answer.text
    assert GHP not in answer.text and not [name for name in PRIVATE if name in answer.text]
