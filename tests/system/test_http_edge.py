"""The HTTP edge of a real `agent-world serve`: proxy headers believed from nobody by default, and request
heads that never finish closed (server/header_timeout.py). Before: X-Forwarded-For was believed from
127.0.0.1, so any local client could rotate it past the wrong-token limit (or get another address locked
out); and a connection that sent half a request line was held forever, one file descriptor each."""
from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.fixtures.eventually import eventually
from tests.fixtures.server import ServerProcess, start_server

HEAD_TIMEOUT = 1.0  # --header-timeout for the test (default 10 s)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with the default --forwarded-allow-ips (none) and a short --header-timeout."""
    process = start_server(tmp_path_factory.mktemp("edge") / "data",
                           args=["--no-demo", "--header-timeout", str(HEAD_TIMEOUT)])
    try:
        yield process
    finally:
        process.stop()


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (waits a little for it)."""
    sock.settimeout(0.2)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_rotated_x_forwarded_for_is_not_believed_by_default(edge: ServerProcess) -> None:
    with httpx.Client(base_url=edge.url, timeout=10) as guesser:
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
