"""The inbox's socket (`/inbox/ws`, web/inbox.py) serves only someone still signed in: a logout closes it at
once, and an invite revoked since the handshake gets no more lists, only a close. A socket that signed in
keeps its lists while others' wrong tokens lock its address out of new sign-ins.
Security: before, the socket checked who read it only when a decision came in, so after a logout or a
revocation it went on sending every new request of the world (its command and arguments) to the browser."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from starlette.testclient import WebSocketTestSession

from server.api.auth.ratelimit import FailureLimiter
from server.api.auth.session_ends import CLOSE_REASON, session_ends
from server.testing.openai_double import OpenAIDouble
from tests.fixtures.engine import run_on_request
from tests.fixtures.eventually import eventually
from tests.fixtures.inprocess import ORIGIN, Site
from tests.fixtures.ws import closed_before


@pytest.fixture(scope="module")
def double() -> Iterator[OpenAIDouble]:
    with OpenAIDouble() as llm:
        llm.respond_with(run_on_request)
        yield llm


def _world_with_an_agent(site: Site, double: OpenAIDouble, name: str) -> str:
    made = site.api("owner", "POST", "/api/worlds", json={"name": name})
    assert made.status_code == 201, made.text
    world: str = made.json()["id"]
    for agent in ("bob", "carol"):  # one request each: an agent asks again only once its request is decided
        added = site.api("owner", "POST", f"/api/worlds/{world}/agents",
                         json={"name": agent, "provider": "openai", "model": "m", "base_url": double.base_url})
        assert added.status_code == 201, added.text
    return world


def _member(site: Site, world: str, name: str) -> dict[str, Any]:
    made = site.api("owner", "POST", f"/api/worlds/{world}/invites", json={"role": "member", "name": name})
    assert made.status_code == 201, made.text
    invite: dict[str, Any] = made.json()
    return invite


def _ask(site: Site, world: str, agent: str, command: str) -> None:
    """The owner has `agent` ask to run `command`: a request the member could decide, in the member's inbox."""
    said = site.api("owner", "POST", f"/api/worlds/{world}/messages", json={"content": f"@{agent} run {command}"})
    assert said.status_code == 201, said.text


def _first_list(ws: WebSocketTestSession, command: str) -> None:
    while command not in str((frame := ws.receive_json()).get("html", "")):
        assert frame["type"] == "inbox", frame


@contextlib.contextmanager
def _inbox(site: Site, headers: dict[str, str]) -> Iterator[WebSocketTestSession]:
    with site.client.websocket_connect("/inbox/ws", headers={"Origin": ORIGIN, **headers}) as ws:
        yield ws


def test_a_logout_closes_the_inbox_socket_before_another_request_reaches_it(site: Site,
                                                                            double: OpenAIDouble) -> None:
    world = _world_with_an_agent(site, double, "inbox logout")
    invite = _member(site, world, "leaving")
    session = site._sign_in(dict(parse_qsl(urlsplit(invite["url"]).query)))
    cookie = {"Cookie": f"aw_session={session}"}
    with _inbox(site, cookie) as ws:
        _ask(site, world, "bob", "echo before the logout")
        _first_list(ws, "echo before the logout")
        ctx = site.client.app.state.ctx  # type: ignore[attr-defined]
        assert ctx.auth.sessions.key(session) in session_ends(ctx).sockets  # a logout in any process closes it
        assert site.client.post("/logout", headers={"Origin": ORIGIN, **cookie}).status_code in (200, 303)
        site.client.cookies.clear()  # the answer clears a cookie the next requests must not send
        _ask(site, world, "carol", "echo after the logout")
        assert closed_before(ws, "echo after the logout") == (1008, CLOSE_REASON)
        # Its handler ends with the close, whether the client answers it or not (one that never does holds nothing).
        eventually(lambda: ctx.auth.sessions.key(session) not in session_ends(ctx).sockets,
                   what="the inbox socket's handler ended")
        ws.close(1000)


@pytest.mark.parametrize("way", ["token", "session"])
def test_an_inbox_socket_gets_no_more_requests_once_its_invite_is_revoked(site: Site, double: OpenAIDouble,
                                                                         way: str) -> None:
    world = _world_with_an_agent(site, double, f"inbox revoked {way}")
    invite = _member(site, world, f"revoked-{way}")
    if way == "token":
        headers = {"Authorization": f"Bearer {invite['token']}"}
        reason = "invite revoked or world deleted"
    else:
        headers = {"Cookie": f"aw_session={site._sign_in(dict(parse_qsl(urlsplit(invite['url']).query)))}"}
        reason = CLOSE_REASON
    with _inbox(site, headers) as ws:
        _ask(site, world, "bob", "echo before the revocation")
        _first_list(ws, "echo before the revocation")
        assert site.api("owner", "DELETE", f"/api/worlds/{world}/invites/{invite['id']}").status_code == 204
        # The revocation alone wakes the check and closes the socket (nothing else happens in the world).
        assert closed_before(ws, "echo after the revocation") == (1008, reason)
        ws.close(1000)


def test_an_inbox_socket_keeps_its_lists_while_its_address_is_locked_out(site: Site, double: OpenAIDouble) -> None:
    """Wrong tokens from the socket's address (behind one proxy, everyone's) lock it out of new sign-ins, not
    the socket that signed in with a good one. Before, its next list was refused (429) and the socket died."""
    world = _world_with_an_agent(site, double, "inbox lockout")
    invite = _member(site, world, "steady")
    auth = site.client.app.state.ctx.auth  # type: ignore[attr-defined]
    kept, auth.failures = auth.failures, FailureLimiter()  # this test's misses, forgotten after it
    try:
        with _inbox(site, {"Authorization": f"Bearer {invite['token']}"}) as ws:
            _ask(site, world, "bob", "echo before the lockout")
            _first_list(ws, "echo before the lockout")
            for _ in range(1000):  # the limit's burst is far smaller
                if site.client.get("/api/me", headers={"Authorization": "Bearer wrong"}).status_code == 429:
                    break
            assert site.api("owner", "GET", "/api/me").status_code == 429  # locked out, even the owner's token
            said = site.page("owner", "POST", f"/api/worlds/{world}/messages",  # (a session is no guess)
                             json={"content": "@carol run echo during the lockout"})
            assert said.status_code == 201, said.text
            _first_list(ws, "echo during the lockout")
            ws.close(1000)
    finally:
        auth.failures = kept


def test_a_binary_inbox_frame_gets_an_error_and_the_socket_goes_on(site: Site) -> None:
    with _inbox(site, {"Cookie": f"aw_session={site.sessions['owner']}"}) as ws:
        assert ws.receive_json()["type"] == "inbox"
        ws.send_bytes(b"\x00\x01")
        assert ws.receive_json() == {"type": "error", "code": "invalid", "message": "an inbox frame is JSON text"}
        ws.send_text("{}")  # still read
        assert ws.receive_json()["type"] == "error"
        ws.close(1000)
