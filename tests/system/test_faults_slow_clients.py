"""Issue #11 fault 6 and issue #10 finding 7: slow, stalled and greedy WebSocket clients are cut off
at their bounds, and their sockets released, against a real `agent-world serve`."""
from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from websockets.exceptions import ConnectionClosed

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import client_for, make_world, wait_until
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.ws import recv_frame, replay_and_snapshot, small_buffer_socket, ws_connect

STALL = 2.0  # seconds: AGENT_WORLD_WS_STALL_SECONDS for these servers
STALL_PATIENT = 15.0
QUEUE = 100  # frames: AGENT_WORLD_WS_QUEUE_FRAMES, a connection's bound (1,000 by default)


def _strict(data_dir: Path, llm: OpenAIDouble, stall: float) -> ServerProcess:
    """A server that gives up on a client that does not read after `stall` seconds, or QUEUE frames behind."""
    return start_server(data_dir, llm=llm, timeout=60, extra_env={"AGENT_WORLD_WS_STALL_SECONDS": str(stall),
                                                                 "AGENT_WORLD_WS_QUEUE_FRAMES": str(QUEUE)})


@pytest.fixture
def strict_server(tmp_path: Path, llm_double: OpenAIDouble) -> Iterator[ServerProcess]:
    process = _strict(tmp_path / "data", llm_double, STALL)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def patient_server(tmp_path: Path, llm_double: OpenAIDouble) -> Iterator[ServerProcess]:
    """The same bound, and 15 s for a slow reader to reach its close frame (STALL_PATIENT)."""
    process = _strict(tmp_path / "data", llm_double, STALL_PATIENT)
    try:
        yield process
    finally:
        process.stop()


def _server_holds(server: ServerProcess, client_port: int) -> bool:
    """Whether the server process still has a file descriptor for the connection from `client_port`."""
    assert server.proc is not None
    pid = server.proc.pid
    inodes = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(local.split(":")[1], 16) == server.port and int(remote.split(":")[1], 16) == client_port:
            inodes.add(f"socket:[{inode}]")
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return bool(inodes & held)


def _connections_gauge(server: ServerProcess) -> float:
    with client_for(server, server.token) as http:
        text = http.get("/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("agent_world_connections ")))


def _post_all(server: ServerProcess, world: str, contents: list[str]) -> None:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as http:
        for content in contents:
            posted = http.post(f"/api/worlds/{world}/messages", json={"content": content})
            assert posted.status_code == 201, posted.text


async def test_a_client_that_stops_reading_loses_its_socket(strict_server: ServerProcess,
                                                            llm_double: OpenAIDouble) -> None:
    server = strict_server
    with client_for(server, server.token) as owner:
        world = make_world(owner, llm_double, agents=())
    sock = small_buffer_socket(server.port)
    port = sock.getsockname()[1]
    async with ws_connect(server, world, server.token, sock=sock, max_queue=1, max_size=None) as stalled:
        await replay_and_snapshot(stalled)
        assert _server_holds(server, port) and _connections_gauge(server) == 1
        # About 5 MB the client never reads: the server's writes to it block.
        await asyncio.get_running_loop().run_in_executor(None, _post_all, server, world, ["#" * 90_000] * 60)
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: wait_until(lambda: not _server_holds(server, port), timeout=STALL + 30,
                                     what="the server to release the stalled client's socket"))
        assert _connections_gauge(server) == 0
        with pytest.raises(ConnectionClosed):  # and the client, reading at last, finds it closed
            while True:
                await recv_frame(stalled, timeout=10)


async def test_a_slow_reader_is_closed_1013_at_its_bound_and_resumes_from_after(
        patient_server: ServerProcess, llm_double: OpenAIDouble) -> None:
    server = patient_server
    with client_for(server, server.token) as owner:
        world = make_world(owner, llm_double, agents=())
    contents = [f"{n:05d} " + "x" * 20_000 for n in range(3 * QUEUE)]  # more than the bound
    sock = small_buffer_socket(server.port)
    port = sock.getsockname()[1]
    got: list[dict[str, Any]] = []
    async with ws_connect(server, world, server.token, sock=sock, max_queue=1, max_size=None) as slow:
        await replay_and_snapshot(slow)
        flood = asyncio.get_running_loop().run_in_executor(None, _post_all, server, world, contents)
        with pytest.raises(ConnectionClosed):
            while True:
                got.append(await recv_frame(slow, timeout=30))
                # Five frames a second while the flood is posted, so the server's queue overflows; then
                # at full speed, so the close frame (queued behind what the sockets hold) arrives within
                # the server's grace however slowly a loaded machine let us read until then.
                if not flood.done():
                    await asyncio.sleep(0.2)
        await flood
    assert slow.close_code == 1013, (slow.close_code, slow.close_reason)
    reason = slow.close_reason or ""
    assert "after=" in reason
    after = int(reason.split("after=")[1])
    seqs = [f["event"]["seq"] for f in got if f["type"] == "event"]
    assert seqs and seqs[-1] == after and seqs == list(range(seqs[0], after + 1))  # gapless up to after=N
    assert len(seqs) < len(contents), len(seqs)  # closed at its bound, not after the whole backlog
    wait_until(lambda: not _server_holds(server, port), timeout=STALL_PATIENT + 5, what="the socket to be released")
    async with ws_connect(server, world, server.token, after=after, max_size=None) as again:
        events, _, _ = await replay_and_snapshot(again, timeout=30)
    assert [e["content"] for e in events] == contents[len(seqs):]


async def test_resync_of_the_whole_log_is_charged_and_limited(patient_server: ServerProcess,
                                                              llm_double: OpenAIDouble) -> None:
    server = patient_server  # a reader busy with 5 MB replies must not be taken for a stalled one
    with client_for(server, server.token) as owner:
        world = make_world(owner, llm_double, agents=())
    await asyncio.get_running_loop().run_in_executor(None, _post_all, server, world, ["y" * 50_000] * 100)
    async with ws_connect(server, world, server.token, max_size=None, ping_interval=None) as ws:
        await replay_and_snapshot(ws, timeout=60)
        started = time.monotonic()
        for ref in range(10):  # ten 28-byte frames at once, each asking for the whole 5 MB log again
            await ws.send(json.dumps({"type": "resync", "after": 0, "ref": ref}))
        replies: list[dict[str, Any]] = []
        received = 0
        while len(replies) < 10:
            text = await asyncio.wait_for(ws.recv(), 60)
            received += len(text)
            frame = json.loads(text)
            if frame.get("ref") is not None and frame["type"] in ("ack", "error"):
                replies.append(frame)
        elapsed = time.monotonic() - started
    limited = [r for r in replies if r["type"] == "error"]
    print(f"10 whole-log resyncs in a row: {10 - len(limited)} answered, {len(limited)} refused, "
          f"{received / 1e6:.1f} MB sent in {elapsed:.1f} s")
    assert all(r["code"] == "too_many_requests" and "try again" in r["message"] for r in limited), limited
    # At most the budget: 8 MB at once, 1 MB a second, and the one replay that overdraws it.
    assert received <= 8e6 + 1e6 * elapsed + 5.5e6, (received, elapsed)
