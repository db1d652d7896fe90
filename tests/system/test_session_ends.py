"""A session that ends (logout) closes its open sockets, the page's and the JSON one, in every process
(server/api/auth/session_ends.py; across two processes: test_distributed_servers.py).
Security: before, a logged-out browser's open sockets kept receiving events."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2 as httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from server.api.auth.session_ends import CLOSE_CODE, CLOSE_REASON, SESSIONS_CHANNEL, announce_end
from server.bus import Bus, Gap
from server.bus.memory import MemoryBackend
from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import client_for, invite, make_world, sign_in
from tests.fixtures.server import ServerProcess
from tests.fixtures.ws import frames_until_closed, read_until, replay_and_snapshot


@contextlib.contextmanager
def signed_in(server: ServerProcess, world: str, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as browser:
        assert sign_in(browser, f"{server.url}/login?world={world}&token={token}").status_code == 303
        yield browser


@contextlib.asynccontextmanager
async def session_sockets(server: ServerProcess, world: str,
                          cookie: str) -> AsyncIterator[tuple[ClientConnection, ...]]:
    """The world's JSON socket and its page socket, both on the browser session `cookie`."""
    headers = {"Cookie": f"aw_session={cookie}", "Origin": server.url}
    async with connect(f"{server.ws_url}/api/worlds/{world}/ws", additional_headers=headers, open_timeout=10,
                       close_timeout=2) as json_ws, \
            connect(f"{server.ws_url}/w/{world}/ws", additional_headers=headers, open_timeout=10,
                    close_timeout=2) as page_ws:
        await replay_and_snapshot(json_ws)
        yield json_ws, page_ws


async def closed_before_more_news(owner: httpx.Client, world: str, sockets: tuple[ClientConnection, ...]) -> None:
    """After the logout, news in the world must not reach the sockets: each is closed, as ended."""
    assert owner.post(f"/api/worlds/{world}/messages", json={"content": "after the logout"}).status_code == 201
    json_ws, page_ws = sockets
    frames = await frames_until_closed(json_ws)
    assert not any(f.get("event", {}).get("content") == "after the logout" for f in frames), frames
    fragments: list[str] = []
    with contextlib.suppress(ConnectionClosed):  # the page's fragments until it is closed
        async for text in page_ws:
            fragments.append(str(text))
    assert not any("after the logout" in f for f in fragments)
    for ws in sockets:
        assert ws.close_code == CLOSE_CODE and ws.close_reason == CLOSE_REASON, (ws.close_code, ws.close_reason)


async def test_a_logout_closes_the_sessions_open_sockets(server: ServerProcess, llm_double: OpenAIDouble) -> None:
    with client_for(server, server.token) as owner:
        world = make_world(owner, llm_double, agents=())
        member = invite(owner, world, "member", "mia")
        with signed_in(server, world, member["token"]) as browser:
            async with session_sockets(server, world, browser.cookies["aw_session"]) as sockets:
                # Live before the logout: a message reaches the session's socket.
                assert owner.post(f"/api/worlds/{world}/messages", json={"content": "before"}).status_code == 201
                await read_until(sockets[0], _says("before"))
                assert browser.post("/logout", headers={"Origin": server.url}).status_code == 200
                await closed_before_more_news(owner, world, sockets)


def _says(content: str) -> Any:
    return lambda f: f["type"] == "event" and f["event"].get("content") == content


async def test_a_session_end_the_bus_could_not_carry_still_reaches_every_processs_sockets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A logout whose publish failed (a pipelined Redis batch that raised, with no gap to make anyone
    # look again) left that session's sockets in this process open; in the others, until their next gap.
    monkeypatch.setattr("server.bus.base.RETRY_FIRST", 0.01)
    bus = Bus(MemoryBackend())
    await bus.connect()
    publish, down = bus.backend.publish, [True]

    async def refused(channel: str, message: str) -> None:
        if down:
            raise ConnectionError("cannot publish to Redis: connection reset")
        await publish(channel, message)
    bus.backend.publish = refused  # type: ignore[method-assign]
    try:
        async with bus.subscribe(SESSIONS_CHANNEL) as sub:
            with pytest.raises(ConnectionError):
                await announce_end(bus, "session-key")
            assert sub.get_nowait() == "session-key"
            down.clear()  # the bus works again: every process's listener is told to check its sockets
            with pytest.raises(Gap) as told:
                async with asyncio.timeout(5):
                    await sub.get()
            assert not told.value.down
    finally:
        await bus.disconnect()
