"""The HTTP edge of a real `agent-world serve`: proxy headers believed from nobody by default, request
heads that never finish closed, and a cap on one address's open connections (server/http_edge.py).
Before: X-Forwarded-For was believed from 127.0.0.1, so any local client could rotate it past the
wrong-token limit (or get another address locked out); a connection that sent half a request line was
held forever, one file descriptor each; and one address could open connections until the process ran
out of file descriptors."""
from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
from websockets.sync.client import connect

from tests.fixtures.eventually import eventually
from tests.fixtures.server import ServerProcess, start_server

HEAD_TIMEOUT = 1.0  # --header-timeout for the test (default 10 s)
PER_ADDRESS = 6  # --connections-per-address for the test (default 256)


def _edge_server(data: Path) -> Iterator[ServerProcess]:
    """A server with the default --forwarded-allow-ips (none), a short --header-timeout and a low
    --connections-per-address, stopped after."""
    process = start_server(data, args=["--no-demo", "--header-timeout", str(HEAD_TIMEOUT),
                                       "--connections-per-address", str(PER_ADDRESS)])
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _edge_server(tmp_path_factory.mktemp("edge") / "data")


@pytest.fixture
def own_edge(tmp_path: Path) -> Iterator[ServerProcess]:
    """An edge server for one test that locks this machine's address out (which the others would meet:
    past the wrong-token limit a good token gets 429 too)."""
    yield from _edge_server(tmp_path / "data")


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (waits a little for it)."""
    sock.settimeout(0.2)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_rotated_x_forwarded_for_is_not_believed_by_default(own_edge: ServerProcess) -> None:
    with httpx.Client(base_url=own_edge.url, timeout=10) as guesser:
        answers = [guesser.get("/api/worlds", headers={"Authorization": f"Bearer guess-{n}",
                                                       "X-Forwarded-For": f"203.0.113.{n % 250 + 1}"})
                   for n in range(40)]
    statuses = [a.status_code for a in answers]
    assert statuses[:30] == [401] * 30 and statuses[-1] == 429, statuses  # limited by its real address


def test_a_request_head_that_never_finishes_is_closed(edge: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as slow:
        slow.sendall(b"GET /heal")  # half a request line, then nothing

        eventually(lambda: _closed(slow), timeout=HEAD_TIMEOUT + 10, what="the server closing the half-sent request")


def test_a_kept_alive_connection_with_a_late_second_head_is_closed_too(edge: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
        client.sendall(b"GET /heal")  # the next request starts, and stalls

        eventually(lambda: _closed(client), timeout=HEAD_TIMEOUT + 10,
                   what="the server closing the stalled second request")


def test_a_request_whose_head_arrives_in_time_is_answered(edge: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\n")
        client.sendall(b"Host: x\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200")


def test_header_timeout_must_be_a_positive_number(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not a positive number of seconds"):
        start_server(tmp_path / "data", args=["--no-demo", "--header-timeout", "0"], timeout=20)


def _answer(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock.recv(65536)


def test_an_address_past_its_connection_cap_is_answered_503_until_one_closes(edge: ServerProcess) -> None:
    world = httpx.post(f"{edge.url}/api/worlds", headers=edge.headers, json={"name": "Cap"}, timeout=10).json()
    held = [socket.create_connection(("127.0.0.1", edge.port), timeout=10) for _ in range(PER_ADDRESS - 1)]
    # A WebSocket counts for as long as it is open, after its upgrade too.
    socket_url = f"{edge.ws_url}/api/worlds/{world['id']}/ws"
    with connect(socket_url, additional_headers=edge.headers, open_timeout=10) as live:
        assert live.recv(timeout=10)  # upgraded and served
        try:
            for sock in held:  # every held one is still served
                assert _answer(sock).startswith(b"HTTP/1.1 200")
            with socket.create_connection(("127.0.0.1", edge.port), timeout=10) as one_too_many:
                refused = one_too_many.recv(65536)
                assert refused.startswith(b"HTTP/1.1 503") and b"too many connections" in refused
                assert _closed(one_too_many)
        finally:
            held.pop().close()
        eventually(lambda: _fit(edge, 1), timeout=10, what="a connection admitted once one closed")
    # The WebSocket's count is released when it closes: two fit again beside the others held.
    eventually(lambda: _fit(edge, 2), timeout=10, what="two connections admitted once the WebSocket closed")
    for sock in held:
        sock.close()


def _fit(edge: ServerProcess, count: int) -> bool:
    """Whether `count` more connections are served at once (they are closed again)."""
    extra = [socket.create_connection(("127.0.0.1", edge.port), timeout=10) for _ in range(count)]
    try:
        return all(_answer(sock).startswith(b"HTTP/1.1 200") for sock in extra)
    finally:
        for sock in extra:
            sock.close()
