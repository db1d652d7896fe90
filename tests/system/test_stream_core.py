"""The JSON WebSocket (§6) and the page's socket (§7) are one stream (server/api/live/stream.py): the same
admission, registry, stall sweep, connection gauge, revocation and closes, against a real server."""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import client_for, invite, make_world, wait_until
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.ws import read_until, replay_and_snapshot, small_buffer_socket, ws_connect
from tests.system.test_faults_slow_clients import _server_holds

STALL = 2.0  # seconds: AGENT_WORLD_WS_STALL_SECONDS of the stalling server


def _page_connect(server: ServerProcess, world: str, token: str | None, query: str = "chat=main&after=0",
                  headers: dict[str, str] | None = None, **options: Any) -> Any:
    """`async with _page_connect(...) as page`: the world page's socket with `token` as bearer."""
    all_headers = ({"Authorization": f"Bearer {token}"} if token else {}) | (headers or {})
    return connect(f"{server.ws_url}/w/{world}/ws?{query}", additional_headers=all_headers, open_timeout=10,
                   close_timeout=2, **options)


def _json_connect(server: ServerProcess, world: str, token: str | None, query: str = "after=0",
                  headers: dict[str, str] | None = None, **options: Any) -> Any:
    all_headers = ({"Authorization": f"Bearer {token}"} if token else {}) | (headers or {})
    return connect(f"{server.ws_url}/api/worlds/{world}/ws?{query}", additional_headers=all_headers,
                   open_timeout=10, close_timeout=2, **options)


async def _refusal(opening: Any) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of a refused handshake."""
    with pytest.raises(InvalidStatus) as refused:
        async with opening:
            pass
    response = refused.value.response
    return response.status_code, json.loads(response.body or b"{}")


async def _until_closed(socket: ClientConnection) -> None:
    async with asyncio.timeout(10):
        with contextlib.suppress(ConnectionClosed):
            async for _ in socket:
                pass


def _gauge(server: ServerProcess) -> float:
    with client_for(server, server.token) as http:
        text = http.get("/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("agent_world_connections ")))


async def _gauge_is(server: ServerProcess, value: float) -> None:
    await asyncio.to_thread(wait_until, lambda: _gauge(server) == value, 10.0, f"the connection gauge at {value}")


async def test_both_sockets_refuse_a_bad_after_the_same_way(server: ServerProcess, owner: httpx.Client,
                                                            llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    spectator = invite(owner, world, "spectator")["token"]
    cases: list[tuple[str, str | None, str, dict[str, str] | None, int]] = [
        (world, server.token, "after=abc", None, 400),
        (world, server.token, "after=-1", None, 400),
        (world, server.token, "after=" + "9" * 19, None, 400),
        (world, None, "after=0", None, 401),
        (world, "wrong-token-1234567890", "after=0", None, 401),
        (world, server.token, "after=0", {"Origin": "http://evil.example"}, 403),
        ("no-such-world", server.token, "after=0", None, 404),
        ("no-such-world", spectator, "after=0", None, 403),  # no role there: nothing said about the world
    ]
    for target, token, query, headers, status in cases:
        json_answer = await _refusal(_json_connect(server, target, token, query, headers))
        page_answer = await _refusal(_page_connect(server, target, token, "chat=main&" + query, headers))
        assert json_answer == page_answer and json_answer[0] == status, (query, json_answer, page_answer)
    assert (await _refusal(_page_connect(server, world, server.token, "after=x")))[1]["error"]["code"] == "invalid"


async def test_an_after_beyond_the_log_is_a_reset_to_its_end_on_both_sockets(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    """The client holds events the log does not (the storage lost them): it is told so first, and the
    events to come are not dropped as ones it has (before, it was clamped without a word)."""
    world = make_world(owner, llm_double, agents=())
    end = owner.get(f"/api/worlds/{world}/events").json()[-1]["seq"]
    async with _page_connect(server, world, server.token, "chat=main&after=999999") as page, \
            ws_connect(server, world, server.token, after=999999) as ws:
        _, snapshot, before = await replay_and_snapshot(ws)
        assert before[0] == {"type": "reset", "after": end,
                             "message": f"the storage lost this world's events after seq {end}"}
        assert snapshot["last_seq"] == end
        await page.recv()  # its connection id: it was admitted
        async with asyncio.timeout(10):
            while "reload the page" not in await page.recv():
                pass
        posted = owner.post(f"/api/worlds/{world}/messages", json={"content": "after the clamp"})
        seq = posted.json()["seq"]
        await read_until(ws, lambda f: f["type"] == "event" and f["event"]["seq"] == seq)  # not dropped
        async with asyncio.timeout(10):
            while "after the clamp" not in await page.recv():
                pass


async def test_the_connection_gauge_counts_page_sockets(server: ServerProcess, owner: httpx.Client,
                                                        llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    await _gauge_is(server, 0)
    async with ws_connect(server, world, server.token) as ws:
        await replay_and_snapshot(ws)
        async with _page_connect(server, world, server.token) as page:
            await page.recv()
            await _gauge_is(server, 2)
        await _gauge_is(server, 1)
    await _gauge_is(server, 0)


async def test_revoking_an_invite_closes_page_and_json_sockets_alike(server: ServerProcess, owner: httpx.Client,
                                                                     llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    member = invite(owner, world, "member", "mia")
    async with ws_connect(server, world, member["token"]) as ws, \
            _page_connect(server, world, member["token"]) as page:
        await replay_and_snapshot(ws)
        await page.recv()
        await _gauge_is(server, 2)
        assert (await asyncio.to_thread(owner.delete, f"/api/worlds/{world}/invites/{member['id']}")).status_code == 204
        await _until_closed(ws)
        await _until_closed(page)
    assert (ws.close_code, ws.close_reason) == (page.close_code, page.close_reason) == (1008, "invite revoked")
    await _gauge_is(server, 0)


async def test_deleting_a_world_closes_page_and_json_sockets_with_1000(server: ServerProcess, owner: httpx.Client,
                                                                       llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    async with ws_connect(server, world, server.token) as ws, _page_connect(server, world, server.token) as page:
        await replay_and_snapshot(ws)
        await page.recv()
        assert (await asyncio.to_thread(owner.delete, f"/api/worlds/{world}")).status_code == 204
        await _until_closed(ws)
        await _until_closed(page)
    assert (ws.close_code, ws.close_reason) == (page.close_code, page.close_reason) == (1000, "world deleted")


@pytest.fixture
def stalling_server(tmp_path: Path, llm_double: OpenAIDouble) -> Iterator[ServerProcess]:
    process = start_server(tmp_path / "data", llm=llm_double, timeout=60,
                           extra_env={"AGENT_WORLD_WS_STALL_SECONDS": str(STALL)})
    try:
        yield process
    finally:
        process.stop()


def _post_all(server: ServerProcess, world: str, contents: list[str]) -> None:
    with client_for(server, server.token) as http:
        for content in contents:
            assert http.post(f"/api/worlds/{world}/messages", json={"content": content}).status_code == 201


@pytest.mark.parametrize("kind", ["page", "json"])
async def test_a_stalled_socket_page_or_json_is_closed_by_the_same_sweep(stalling_server: ServerProcess,
                                                                 llm_double: OpenAIDouble, kind: str) -> None:
    """Either socket, left unread behind megabytes of frames: the one sweep releases it and the gauge drops."""
    with client_for(stalling_server, stalling_server.token) as owner:
        world = make_world(owner, llm_double, agents=())
    sock = small_buffer_socket(stalling_server.port)
    opening = _page_connect if kind == "page" else _json_connect
    async with opening(stalling_server, world, stalling_server.token, sock=sock, max_queue=1, max_size=None) as ws:
        await ws.recv()
        await _gauge_is(stalling_server, 1)
        client_port = sock.getsockname()[1]
        assert _server_holds(stalling_server, client_port)
        await asyncio.to_thread(_post_all, stalling_server, world, ["x" * 90_000] * 60)
        await asyncio.to_thread(wait_until, lambda: not _server_holds(stalling_server, client_port), STALL + 10,
                                "the server to release the stalled socket")
        await _gauge_is(stalling_server, 0)
        with pytest.raises(ConnectionClosed):  # and the client, reading at last, finds it closed
            async with asyncio.timeout(10):
                while True:
                    await ws.recv()


async def test_a_stream_that_finds_the_log_behind_it_closes_at_once_saying_where_to_go_on() -> None:
    """After a bus gap the log ends before what the stream sent (the storage lost events): the lost notice,
    then the 1011 with `after=` (docs/protocol.md §6). The close was asked for while the writer held the
    stream's lock: it waited CLOSE_TIMEOUT (5 s) for it, then aborted the transport instead."""
    from types import SimpleNamespace

    from server.api.flood import Floods
    from server.api.live.stream import STORAGE_LOST, Stream
    from server.bus.base import Gap

    class Socket:
        def __init__(self) -> None:
            self.sent: list[str] = []
            self.closed: list[tuple[int, str]] = []

        async def send_text(self, text: str) -> None:
            self.sent.append(text)

        async def close(self, code: int, reason: str = "") -> None:
            self.closed.append((code, reason))

    class Bare(Stream):
        def replayed(self, event: dict[str, Any]) -> str:
            return ""

        def live_event(self, text: str) -> str:
            return ""

        def live_other(self, text: str) -> str:
            return ""

        async def send_state(self) -> None:
            pass

        def notice(self, code: str, message: str) -> str:
            return message

        def lost_notice(self) -> str:
            return "lost"

        async def on_message(self, message: dict[str, Any]) -> bool:
            return True

    ends = [9, 3]  # the log's end when the stream starts, then after the gap (Redis came back without them)

    async def last_seq(world: str) -> int:
        return ends.pop(0) if len(ends) > 1 else ends[0]

    async def events(world: str, after: int, limit: int) -> list[dict[str, Any]]:
        return []

    class OneGap:
        overflowed, direct, channel = False, None, "w"

        async def get(self) -> str:
            raise Gap("w", down=False)
    socket = Socket()
    ctx = SimpleNamespace(engine=SimpleNamespace(last_seq=last_seq, events=events), floods=Floods())
    stream = Bare(socket, ctx, "w", SimpleNamespace(identity="owner"), OneGap())  # type: ignore[arg-type]
    writer = asyncio.create_task(stream._write(9))
    try:
        async with asyncio.timeout(2):
            while not socket.closed:
                await asyncio.sleep(0.01)
        assert socket.sent == ["lost"] and socket.closed == [(1011, f"{STORAGE_LOST}: reconnect with after=3")]
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
