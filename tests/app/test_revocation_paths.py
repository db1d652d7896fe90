"""A revocation (or a world's deletion) ends a socket whichever way it reaches the stream (server/api/live/stream.py):
live, gap-filled when the bus delivers it late, replayed at connect, or not at all (revoked between the
socket's admission and its subscription). Both sockets: the JSON one and the page's.
Security: before, only live frames were checked, after the duplicate check, so a revocation that came by
the log left the revoked member's socket open with its role (it could still post and decide)."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from starlette.testclient import WebSocketTestSession

from server.api.auth.session_ends import CLOSE_REASON, SESSIONS_CHANNEL, session_ends
from server.api.context import Principal
from server.engine.store import channel
from server.engine.world.invites import OWNER_NAME
from tests.fixtures.eventually import eventually
from tests.fixtures.inprocess import ORIGIN, Site
from tests.fixtures.ws import closed_before


def _invite(site: Site, world: str, name: str) -> dict[str, Any]:
    made = site.api("owner", "POST", f"/api/worlds/{world}/invites", json={"role": "member", "name": name})
    assert made.status_code == 201, made.text
    invite: dict[str, Any] = made.json()
    return invite


def _world(site: Site, name: str) -> str:
    made = site.api("owner", "POST", "/api/worlds", json={"name": name})
    assert made.status_code == 201, made.text
    world: str = made.json()["id"]
    return world


@contextlib.contextmanager
def _socket(site: Site, kind: str, world: str, invite: dict[str, Any],
            after: int = 0) -> Iterator[WebSocketTestSession]:
    """The JSON socket on the invite's bearer token, or the page's on a session signed in with its link."""
    if kind == "json":
        with site.client.websocket_connect(f"/api/worlds/{world}/ws?after={after}",
                                           headers={"Authorization": f"Bearer {invite['token']}"}) as ws:
            yield ws
    else:
        session = site._sign_in(dict(parse_qsl(urlsplit(invite["url"]).query)))
        with site.client.websocket_connect(f"/w/{world}/ws?after={after}",
                                           headers={"Origin": ORIGIN, "Cookie": f"aw_session={session}"}) as ws:
            yield ws


def _owner_posts(site: Site, world: str, content: str) -> None:
    assert site.api("owner", "POST", f"/api/worlds/{world}/messages", json={"content": content}).status_code == 201


@contextlib.contextmanager
def _before_subscribing(site: Site, world: str, act: Callable[[], Any]) -> Iterator[None]:
    """Run the coroutine `act()` once, in the server, between a socket's admission and its subscription."""
    bus = site.client.app.state.ctx.engine.store.bus  # type: ignore[attr-defined]
    original, pending = bus.subscribe, [act]

    @contextlib.asynccontextmanager
    async def subscribe(ch: str, **kwargs: Any) -> AsyncIterator[Any]:
        if ch == channel(world) and pending:
            await pending.pop()()
        async with original(ch, **kwargs) as sub:
            yield sub

    bus.subscribe = subscribe
    try:
        yield
    finally:
        del bus.subscribe  # the method again


def _revoking(site: Site, world: str, invite: dict[str, Any]) -> Callable[[], Any]:
    engine = site.client.app.state.ctx.engine  # type: ignore[attr-defined]
    return lambda: engine.revoke_invite(world, Principal(name=OWNER_NAME, owner=True).actor(world), invite["id"])


def _revoked_late(site: Site, world: str, invite: dict[str, Any], ws: WebSocketTestSession) -> None:
    """Revoke the invite of `ws` (live) while the revoking process holds back its publish of the revocation."""
    bus = site.client.app.state.ctx.engine.store.bus  # type: ignore[attr-defined]
    _owner_posts(site, world, "before")  # the stream is live once this reaches it
    while "before" not in str(ws.receive().get("text", "")):
        pass
    held: list[tuple[str, str]] = []

    async def late(ch: str, message: str) -> None:
        if '"invite_revoked"' in message:
            held.append((ch, message))
            return
        await type(bus).publish(bus, ch, message)

    bus.publish = late
    try:
        assert site.api("owner", "DELETE", f"/api/worlds/{world}/invites/{invite['id']}").status_code == 204
    finally:
        del bus.publish
    assert held, "the revocation was not held back"


@pytest.mark.parametrize("kind", ["json", "page"])
def test_a_revocation_gap_filled_ends_the_socket(site: Site, kind: str) -> None:
    """The revoking process publishes late: the next event brings the revocation from the log first."""
    world = _world(site, f"gap {kind}")
    invite = _invite(site, world, f"victim-{kind}")
    with _socket(site, kind, world, invite) as ws:
        _revoked_late(site, world, invite, ws)
        _owner_posts(site, world, "after the revocation")
        assert closed_before(ws, "after the revocation") == (1008, "invite revoked"), kind


@pytest.mark.parametrize("kind", ["json", "page"])
@pytest.mark.parametrize("after", [0, 10**9])
def test_a_revocation_before_subscribing_ends_the_socket(site: Site, kind: str, after: int) -> None:
    """Revoked between admission and subscription: replayed at connect (after=0), or not replayed at all
    (the client already has the events) and caught by the check once subscribed."""
    world = _world(site, f"connect {kind} {after}")
    invite = _invite(site, world, f"late-{kind}")
    with _before_subscribing(site, world, _revoking(site, world, invite)), \
            _socket(site, kind, world, invite, after) as ws:
        _owner_posts(site, world, "after the revocation")
        code, reason = closed_before(ws, "after the revocation")
        # A page's session rests on the invite too: session_ends.py may close it first, as ended.
        assert code == 1008 and reason in ("invite revoked", CLOSE_REASON), (kind, after, reason)


def test_a_world_deleted_before_subscribing_ends_the_socket(site: Site) -> None:
    """The deletion replayed at connect closes the socket as a live one does: 1000 world deleted."""
    world = _world(site, "doomed")
    invite = _invite(site, world, "guest")
    engine = site.client.app.state.ctx.engine  # type: ignore[attr-defined]
    owner = Principal(name=OWNER_NAME, owner=True).actor(world)
    with _before_subscribing(site, world, lambda: engine.delete_world(world, owner)), \
            _socket(site, "json", world, invite) as ws:
        ws.send_json({"type": "resync", "ref": "probe"})  # answered by a socket left open (nothing else comes)
        assert closed_before(ws, '"probe"') == (1000, "world deleted")


@pytest.mark.parametrize("kind", ["json", "page"])
def test_a_revoked_socket_cannot_write_before_it_hears_of_it(site: Site, kind: str) -> None:
    """Nothing else happens in the world after the (late) revocation: the socket's next frame is refused
    (checked against the log before it is applied) and the socket closed."""
    world = _world(site, f"write {kind}")
    invite = _invite(site, world, f"writer-{kind}")
    with _socket(site, kind, world, invite) as ws:
        _revoked_late(site, world, invite, ws)
        ws.send_json({"type": "say", "content": "written after my invite was revoked", "ref": "r1"})
        assert closed_before(ws, "written after my invite was revoked") == (1008, "invite revoked")
    logged = site.api("owner", "GET", f"/api/worlds/{world}/events", params={"after": 0}).json()
    assert "written after my invite was revoked" not in [e.get("content") for e in logged]


@contextlib.contextmanager
def _signed_in(site: Site, kind: str, name: str) -> Iterator[tuple[str, str, WebSocketTestSession]]:
    """A new world's member signed in with their link (a session), and that session's socket, live once
    the owner's "before" reached it: (world, session, socket)."""
    world = _world(site, name)
    session = site._sign_in(dict(parse_qsl(urlsplit(_invite(site, world, name)["url"]).query)))
    path = f"/api/worlds/{world}/ws?after=0" if kind == "json" else f"/w/{world}/ws?after=0"
    with site.client.websocket_connect(path, headers={"Origin": ORIGIN, "Cookie": f"aw_session={session}"}) as ws:
        yield world, session, ws


def _posts_through(site: Site, world: str, content: str, publish: Callable[[str, str], Any]) -> None:
    """The owner posts `content` while the server's bus publishes through `publish`."""
    bus = site.client.app.state.ctx.engine.store.bus  # type: ignore[attr-defined]
    bus.publish = publish
    try:
        _owner_posts(site, world, content)
    finally:
        del bus.publish  # the method again


def _answer_close(site: Site, ws: WebSocketTestSession, session: str) -> None:
    """The client answers the close, as a browser does, and the server's handler ends (the test client
    leaving cancels one still running)."""
    ws.close(1000)
    ctx = site.client.app.state.ctx  # type: ignore[attr-defined]
    ends = session_ends(ctx)
    eventually(lambda: ctx.auth.sessions.key(session) not in ends.sockets, what="the socket's handler ended")


@pytest.mark.parametrize("kind", ["json", "page"])
@pytest.mark.parametrize("first", [False, True], ids=["end-first", "behind-a-frame"])
def test_news_the_bus_hands_over_with_a_session_s_end_does_not_reach_its_sockets(site: Site, kind: str,
                                                                                   first: bool) -> None:
    """Another process's bus reads a session's end and the next news in one read, and hands both over in
    the same turn: the stream's writer ran before the close got under way and sent the news (a flaky
    two-process test, test_distributed_servers.py, caught it). With a frame of the world's handed over
    just before the end (`first`), the writer wakes before the listener does. Security: a logged-out
    browser's socket got a message posted after its logout."""
    ctx = site.client.app.state.ctx  # type: ignore[attr-defined]
    bus = ctx.engine.store.bus
    sent: list[str] = []  # the world's frames on the bus

    with _signed_in(site, kind, f"ended {kind} {first}") as (world, session, ws):
        async def recorded(ch: str, message: str) -> None:
            if ch == channel(world):
                sent.append(message)
            await type(bus).publish(bus, ch, message)

        async def with_the_end(ch: str, message: str) -> None:
            if ch == channel(world) and "after the logout" in message:
                await ctx.auth.sessions.end(session)
                if first:
                    bus.deliver_here(ch, sent[-1])  # "before" again: a copy the stream drops, once awake
                bus.deliver_here(SESSIONS_CHANNEL, ctx.auth.sessions.key(session))  # then the news, this turn
            await type(bus).publish(bus, ch, message)

        _posts_through(site, world, "before", recorded)  # the stream is live once this reaches it
        while "before" not in str(ws.receive().get("text", "")):
            pass
        _posts_through(site, world, "after the logout", with_the_end)
        assert closed_before(ws, "after the logout") == (1008, CLOSE_REASON), kind
        _answer_close(site, ws, session)


@pytest.mark.parametrize("kind", ["json", "page"])
def test_a_session_that_ended_in_a_bus_gap_gets_nothing_of_the_gap(site: Site, kind: str) -> None:
    """The bus lost both the session's end and the world's next news (a gap): after the gap the stream checks
    the session before it replays the log. Security: before, it checked only the invite, and the news
    replayed from the log reached the logged-out browser."""
    ctx = site.client.app.state.ctx  # type: ignore[attr-defined]
    bus = ctx.engine.store.bus

    with _signed_in(site, kind, f"gap ended {kind}") as (world, session, ws):
        async def lost(ch: str, message: str) -> None:
            if ch == channel(world) and "after the logout" in message:
                await ctx.auth.sessions.end(session)  # its end never said on the bus
                bus.missed(ch)  # and this news not carried either: a gap, then the log
                return
            await type(bus).publish(bus, ch, message)

        _owner_posts(site, world, "before")
        while "before" not in str(ws.receive().get("text", "")):
            pass
        _posts_through(site, world, "after the logout", lost)
        assert closed_before(ws, "after the logout") == (1008, CLOSE_REASON), kind
        _answer_close(site, ws, session)
