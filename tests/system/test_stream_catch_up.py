"""A socket's live stream (server/api/live/stream.py) after it fell behind: every event once and in order,
for the socket that read all along and the one that caught up."""
from __future__ import annotations

import asyncio
from typing import Any

import httpx2 as httpx

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import make_world
from tests.fixtures.server import ServerProcess
from tests.fixtures.ws import read_until, replay_and_snapshot, small_buffer_socket, ws_connect


async def test_a_socket_that_fell_behind_and_caught_up_gets_every_event_once_in_order(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    # 120 events of 30 KB (3.6 MB): more than the kernel's buffers for a client that does not read, so its
    # transport pauses and frames wait in its queue; the one that reads keeps taking them directly.
    big = [f"{n:04d}" + "#" * 30_000 for n in range(120)]
    world = make_world(owner, llm_double, agents=())  # no agents: every frame is a human message's event

    def post(contents: list[str]) -> None:
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as http:
            for content in contents:
                posted = http.post(f"/api/worlds/{world}/messages", json={"content": content})
                assert posted.status_code == 201, posted.text

    def contents(frames: list[dict[str, Any]]) -> list[str]:
        return [f["event"]["content"] for f in frames if f["type"] == "event" and f["event"].get("role") == "user"]

    def seqs(frames: list[dict[str, Any]]) -> list[int]:
        return [f["event"]["seq"] for f in frames if f["type"] == "event"]

    async with ws_connect(server, world, server.token, max_size=None) as reading, \
            ws_connect(server, world, server.token, sock=small_buffer_socket(server.port), max_queue=1,
                       compression=None, max_size=None) as lagging:
        _, snapshot, _ = await replay_and_snapshot(reading)
        await replay_and_snapshot(lagging)
        await asyncio.to_thread(post, big)  # `lagging` reads nothing meanwhile
        got_reading = await read_until(reading, lambda f: contents([f]) == [big[-1]], timeout=60)
        got_lagging = await read_until(lagging, lambda f: contents([f]) == [big[-1]], timeout=60)
        # Caught up again: what comes now reaches both, after what came before.
        small = [f"small {n}" for n in range(30)]
        await asyncio.to_thread(post, small)
        for ws, got in ((reading, got_reading), (lagging, got_lagging)):
            got.extend(await read_until(ws, lambda f: contents([f]) == [small[-1]], timeout=30))
    for got in (got_reading, got_lagging):
        assert contents(got) == big + small
        numbers = seqs(got)
        assert numbers == list(range(snapshot["last_seq"] + 1, snapshot["last_seq"] + 1 + len(numbers)))
