"""Issue #11 fault 6 and issue #10 finding 7: slow, stalled and greedy WebSocket clients are cut off
at their bounds, and their sockets released, against a real `agent-world serve`."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from websockets.exceptions import ConnectionClosed

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import client_for, make_world, wait_until
from tests.fixtures.eventually import eventually_async
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.ws import recv_frame, replay_and_snapshot, small_buffer_socket, ws_connect

STALL = 2.0  # seconds: AGENT_WORLD_WS_STALL_SECONDS for these servers
STALL_PATIENT = 15.0
QUEUE = 100  # frames: AGENT_WORLD_WS_QUEUE_FRAMES, a connection's bound (1,000 by default)
# A bound above the batches a writer takes behind a 5-frames-a-second reader of 40 a second (1, 8, 64, 512):
# drained before the bound was checked, a batch of 512 kept such a reader for 100 s.
LONG_QUEUE = 600


@contextlib.contextmanager
def _strict(data_dir: Path, llm: OpenAIDouble, stall: float, queue: int = QUEUE) -> Iterator[ServerProcess]:
    """A server that gives up on a client that does not read after `stall` seconds, or `queue` frames behind."""
    process = start_server(data_dir, llm=llm, timeout=60, extra_env={"AGENT_WORLD_WS_STALL_SECONDS": str(stall),
                                                                    "AGENT_WORLD_WS_QUEUE_FRAMES": str(queue)})
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def strict_server(tmp_path: Path, llm_double: OpenAIDouble) -> Iterator[ServerProcess]:
    with _strict(tmp_path / "data", llm_double, STALL) as process:
        yield process


@pytest.fixture
def patient_server(tmp_path: Path, llm_double: OpenAIDouble) -> Iterator[ServerProcess]:
    """The same bound, and 15 s for a slow reader to reach its close frame (STALL_PATIENT)."""
    with _strict(tmp_path / "data", llm_double, STALL_PATIENT) as process:
        yield process


@pytest.fixture
def long_queue_server(tmp_path: Path, llm_double: OpenAIDouble) -> Iterator[ServerProcess]:
    """15 s to reach a close frame (STALL_PATIENT), LONG_QUEUE frames behind."""
    with _strict(tmp_path / "data", llm_double, STALL_PATIENT, LONG_QUEUE) as process:
        yield process


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


def _post_until(server: ServerProcess, world: str, stop: threading.Event, posted: list[int]) -> None:
    """Post 20 KB messages, about 40 a second, until `stop`, counting them in `posted`."""
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as http:
        while not stop.wait(0.025):
            reply = http.post(f"/api/worlds/{world}/messages", json={"content": f"{posted[0]:05d} " + "z" * 20_000})
            assert reply.status_code == 201, reply.text
            posted[0] += 1


async def _read_slowly(ws: Any, got: list[dict[str, Any]]) -> None:
    """Read five frames a second until the server closes the socket."""
    with pytest.raises(ConnectionClosed):
        while True:
            got.append(await recv_frame(ws, timeout=30))
            await asyncio.sleep(0.2)


async def test_a_reader_of_five_frames_a_second_is_closed_1013_a_bound_behind(
        long_queue_server: ServerProcess, llm_double: OpenAIDouble) -> None:
    server = long_queue_server  # the world posts 20 KB frames eight times as fast as it reads, while it is open
    with client_for(server, server.token) as owner:
        world = make_world(owner, llm_double, agents=())
    stop, posted = threading.Event(), [0]
    got: list[dict[str, Any]] = []
    async with ws_connect(server, world, server.token, sock=small_buffer_socket(server.port), max_queue=1,
                          max_size=None) as slow:
        await replay_and_snapshot(slow)
        flood = asyncio.get_running_loop().run_in_executor(None, _post_until, server, world, stop, posted)
        reader = asyncio.create_task(_read_slowly(slow, got))
        try:
            await eventually_async(reader.done, timeout=120, what="the slow reader to be closed",
                                   describe=lambda _: f"{len(got)} frames read, {posted[0]} posted")
        finally:
            stop.set()
            await flood
            reader.cancel()
        await reader
    assert slow.close_code == 1013, (slow.close_code, slow.close_reason)
    after = int((slow.close_reason or "").split("after=")[1])
    seqs = [f["event"]["seq"] for f in got if f["type"] == "event"]
    assert seqs and seqs[-1] == after and seqs == list(range(seqs[0], after + 1))  # gapless up to after=N
    # Closed once a bound behind (sent about a seventh of it by then, and what the buffers held), not after
    # writing out at 5 frames a second a batch it had taken from the queue, of up to the bound.
    assert len(seqs) < LONG_QUEUE // 2, (len(seqs), posted[0])
    assert "frames behind" in server.log()


async def test_a_reader_that_keeps_up_is_not_closed(patient_server: ServerProcess, llm_double: OpenAIDouble) -> None:
    server = patient_server
    with client_for(server, server.token) as owner:
        world = make_world(owner, llm_double, agents=())
    contents = [f"{n:05d} " + "k" * 20_000 for n in range(3 * QUEUE)]  # three bounds' worth
    got: list[int] = []
    async with ws_connect(server, world, server.token, max_size=None) as fast:
        await replay_and_snapshot(fast)
        flood = asyncio.get_running_loop().run_in_executor(None, _post_all, server, world, contents)
        while len(got) < len(contents):
            frame = await recv_frame(fast, timeout=30)
            if frame["type"] == "event" and frame["event"]["kind"] == "message":
                got.append(frame["event"]["seq"])
        await flood
        await fast.ping()
        assert fast.close_code is None  # still open
    assert got == list(range(got[0], got[0] + len(contents)))


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
