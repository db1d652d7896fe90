"""Where an OAuth MCP server's sign-in may connect (issue #33 review): discovery, registration, token and
revocation requests go where the untrusted server's answers point, so a connection to a loopback, private or
link-local address is refused unless the owner's MCP server URL is itself on one; answers are bounded."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx2
import pytest

from server.tools.mcp.oauth_http import READ_LIMIT, oauth_client, private_allowed, short

PUBLIC_MCP = "https://93.184.216.34/mcp"  # a public address: never connected to here


@pytest.fixture
async def internal() -> AsyncIterator[tuple[str, list[bytes]]]:
    """An HTTP server on 127.0.0.2 (the cloud metadata service's stand-in): its URL and what reached it."""
    hits: list[bytes] = []
    body = b"AWS_SECRET_ACCESS_KEY=internal-only" + b"x" * (2 * READ_LIMIT)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(await reader.read(4096))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()
    server = await asyncio.start_server(handle, "127.0.0.2", 0)
    yield f"http://127.0.0.2:{server.sockets[0].getsockname()[1]}/latest/meta-data/", hits
    server.close()


async def test_a_sign_in_for_a_public_server_never_reaches_a_private_address(
        internal: tuple[str, list[bytes]]) -> None:
    url, hits = internal
    async with await oauth_client(PUBLIC_MCP) as client:
        with pytest.raises(httpx2.ConnectError, match="loopback"):
            await client.get(url)
    assert not hits


async def test_a_server_on_the_owners_network_signs_in_there_with_bounded_answers(
        internal: tuple[str, list[bytes]]) -> None:
    url, hits = internal
    assert await private_allowed("http://127.0.0.1:9/mcp") and not await private_allowed(PUBLIC_MCP)
    async with await oauth_client("http://127.0.0.1:9/mcp") as client:
        with pytest.raises(httpx2.ReadError, match="larger than"):
            await client.get(url)  # reached (the owner's own network), but 2 MiB is not read
    assert hits


def test_a_failure_reason_quoting_an_answer_is_cut_short() -> None:
    assert short("x" * 10_000) == "x" * 300 + "…" and short("refused") == "refused"
