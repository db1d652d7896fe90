"""A call's proxy (server/tools/egress/proxy.py) in this process, between a client on its Unix socket and an
upstream server on loopback that keeps every byte it gets. The world's side is a `Gate` of the test's own
(the engine's is tests/engine/test_network_requests.py's), and the name lookup answers 127.0.0.1 (the
address checks are tests/unit/test_egress_parsing.py's)."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from server.tools.base import Passage, ToolContext
from server.tools.egress import proxy as proxy_mod
from server.tools.egress.addresses import IpAddress
from server.tools.egress.proxy import MAX_CONNECTIONS, SOCKET_NAME, CallProxy
from server.tools.sandbox import world_users
from tests.fixtures.eventually import eventually_async
from tests.unit.test_egress_parsing import client_hello, in_two_records


@dataclass
class Gate:
    """Allows `allowed.example` by the rule `rule_1`, denies anything else; waits for `open` first."""
    open: asyncio.Event = field(default_factory=asyncio.Event)
    asked: list[tuple[str, int]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.open.set()

    async def ask(self, ctx: ToolContext, tool: str, host: str, port: int) -> Passage:
        self.asked.append((host, port))
        await self.open.wait()
        return Passage(by={"rule_id": "rule_1"}) if host == "allowed.example" else Passage("denied")

    async def record(self, ctx: ToolContext, tool: str, connection: dict[str, Any]) -> None:
        self.records.append(dict(connection))


@dataclass
class Upstream:
    port: int
    got: bytearray


@pytest.fixture
async def upstream(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Upstream]:
    """allowed.example, on loopback: keeps what it gets, closes when the proxy's side ends."""
    got = bytearray()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            got.extend(data)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)

    async def resolve(host: str, port: int) -> list[IpAddress]:
        return [ipaddress.ip_address("127.0.0.1")]

    monkeypatch.setattr(proxy_mod, "resolve", resolve)
    yield Upstream(server.sockets[0].getsockname()[1], got)
    server.close()
    await server.wait_closed()


def context(tmp_path: Path, gate: Gate) -> ToolContext:
    return ToolContext("w", "alice", "main", tmp_path / "w", "call_1", gate)


async def through_proxy(tmp_path: Path, gate: Gate, steps: list[bytes | float]) -> bytes:
    """Send `steps` (a float: a pause, so that the proxy reads what came before by itself), then end the
    sending side; what the proxy answered."""
    async with CallProxy(context(tmp_path, gate), "shell_exec", gate) as proxy:
        reader, writer = await asyncio.open_unix_connection(str(proxy.folder / SOCKET_NAME))
        answer = b""
        for step in steps:
            if isinstance(step, float):
                await asyncio.sleep(step)
                continue
            writer.write(step)
            await writer.drain()
            if step.startswith(b"CONNECT"):
                answer += await reader.readuntil(b"\r\n\r\n")
        writer.write_eof()
        answer += await reader.read()
        writer.close()
    return answer


def connect(upstream: Upstream) -> bytes:
    return f"CONNECT allowed.example:{upstream.port} HTTP/1.1\r\n\r\n".encode()


async def test_a_tls_hello_whose_first_byte_comes_alone_is_still_checked_for_its_server_name(
        tmp_path: Path, upstream: Upstream) -> None:
    hello = client_hello("evil.example")
    answer = await through_proxy(tmp_path, Gate(), [connect(upstream), hello[:1], 0.2, hello[1:]])
    assert b"200 Connection established" in answer
    assert not upstream.got, "a ClientHello for evil.example went to allowed.example"


async def test_a_tls_hello_over_two_records_is_checked_for_the_server_name_in_the_second(
        tmp_path: Path, upstream: Upstream) -> None:
    first, second = in_two_records(client_hello("evil.example"))
    gate = Gate()
    await through_proxy(tmp_path, gate, [connect(upstream), first, 0.1, second])
    assert not upstream.got, "the server name evil.example went to allowed.example in a second record"
    [record] = gate.records
    assert record["decision"] == "cut" and "evil.example" in record["reason"], record


async def test_a_tls_hello_without_a_server_name_is_cut_on_a_tunnel_to_a_name(
        tmp_path: Path, upstream: Upstream) -> None:
    gate = Gate()
    await through_proxy(tmp_path, gate, [connect(upstream), client_hello(None)])
    assert not upstream.got
    assert "names no server" in gate.records[0]["reason"], gate.records
    hello = client_hello("allowed.example")  # the host it named: goes through as it is
    await through_proxy(tmp_path, gate, [connect(upstream), hello[:3], 0.1, hello[3:]])
    assert bytes(upstream.got) == hello
    assert gate.records[1]["decision"] == "allowed" and gate.records[1]["rule_id"] == "rule_1", gate.records


async def test_a_plain_request_goes_up_with_its_urls_host_and_nothing_after_its_body(
        tmp_path: Path, upstream: Upstream) -> None:
    head = (f"POST http://allowed.example:{upstream.port}/ HTTP/1.1\r\nHost: evil.example\r\n"
            "Transfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nTrailer: t\r\n\r\n"
            "GET http://evil.example/second HTTP/1.1\r\nHost: evil.example\r\n\r\n").encode()
    gate = Gate()
    await through_proxy(tmp_path, gate, [head])
    assert bytes(upstream.got) == (f"POST / HTTP/1.1\r\nHost: allowed.example:{upstream.port}\r\n"
                                   "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                                   ).encode()
    assert gate.records[0]["sent"] == len(upstream.got), gate.records


async def test_a_request_naming_no_clear_host_is_answered_400_and_recorded(tmp_path: Path) -> None:
    gate = Gate()
    answer = await through_proxy(tmp_path, gate, [b"CONNECT 0x7f.1:443 HTTP/1.1\r\n\r\n"])
    assert answer.startswith(b"HTTP/1.1 400 not a host name"), answer
    [record] = gate.records
    assert (record["host"], record["decision"]) == ("", "refused") and "0x7f.1" in record["reason"], record
    assert not gate.asked


async def test_a_call_has_at_most_so_many_connections_open_and_the_others_are_answered_429(
        tmp_path: Path, upstream: Upstream) -> None:
    gate = Gate()
    gate.open.clear()  # a person deciding
    async with CallProxy(context(tmp_path, gate), "shell_exec", gate) as proxy:
        connections = [await asyncio.open_unix_connection(str(proxy.folder / SOCKET_NAME))
                       for _ in range(MAX_CONNECTIONS)]
        for n, (_, writer) in enumerate(connections):
            writer.write(f"CONNECT h{n}.example:443 HTTP/1.1\r\n\r\n".encode())
        await eventually_async(lambda: len(gate.asked) == MAX_CONNECTIONS, what="the connections asked about")
        more = [await asyncio.open_unix_connection(str(proxy.folder / SOCKET_NAME)) for _ in range(8)]
        refused = [await reader.read() for reader, _ in more]  # answered at once, before they say anything
        gate.open.set()
        answers = [await reader.read() for reader, _ in connections]
        for _, writer in connections + more:
            writer.close()
    assert len(gate.asked) == MAX_CONNECTIONS, gate.asked
    assert [a.split(b" ")[1] for a in answers] == [b"403"] * MAX_CONNECTIONS
    assert [a.split(b" ")[1] for a in refused] == [b"429"] * 8


async def test_a_connection_left_waiting_at_the_calls_end_ends_without_an_error_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gate = Gate()
    gate.open.clear()
    with caplog.at_level(logging.ERROR):
        async with CallProxy(context(tmp_path, gate), "shell_exec", gate) as proxy:
            reader, writer = await asyncio.open_unix_connection(str(proxy.folder / SOCKET_NAME))
            writer.write(b"CONNECT waiting.example:443 HTTP/1.1\r\n\r\n")
            await eventually_async(lambda: gate.asked, what="the connection asked about")
        assert await reader.read() == b""  # closed with the call
        writer.close()
        await asyncio.sleep(0)  # the stream server's own task ends after the handler's
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records
    assert gate.records[0]["decision"] == "refused", gate.records


async def test_the_proxy_socket_is_the_sandbox_users_alone(tmp_path: Path) -> None:
    gate = Gate()
    ctx = context(tmp_path, gate)
    async with CallProxy(ctx, "shell_exec", gate) as proxy:
        folder, socket = os.stat(proxy.folder), os.stat(proxy.folder / SOCKET_NAME)
    owner = world_users.sandbox_uid(ctx.workspace) if os.geteuid() == 0 else os.geteuid()
    assert (stat.S_IMODE(folder.st_mode), folder.st_uid) == (0o700, owner)
    assert (stat.S_IMODE(socket.st_mode), socket.st_uid) == (0o600, owner)
