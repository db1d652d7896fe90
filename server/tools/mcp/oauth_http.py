"""The HTTP client of an OAuth MCP server's sign-in, refresh and revocation: it goes only where it may.

Discovery, registration, the token and revocation endpoints are all where the MCP server's (untrusted)
answers point: `WWW-Authenticate: Bearer resource_metadata="http://169.254.169.254/…"` would have the server
fetch its own cloud credentials. So each connection is checked on the address it really connects to (one
resolution for the check and the connection, as webhooks do: server/webhooks/targets.py): the loopback,
private, link-local and the server's own addresses are refused, unless the owner's MCP server URL is itself
on one (a server on the owner's own network signs in there). Environment proxies are not used: through one
the check would see the proxy, not the target. A sign-in's connections read at most `READ_LIMIT` bytes.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ...webhooks.targets import RefusedTarget, check_address, refusal

if TYPE_CHECKING:  # imported where first used (a server connecting), with the SDK
    import httpcore2
    import httpx2

READ_LIMIT = 1024 * 1024  # bytes one connection of a sign-in or a revocation reads
REASON_LIMIT = 300  # characters of a failure reason that may quote a response body
HINT = "an OAuth MCP server's sign-in reaches such an address only when the server's own URL is on one"


def short(reason: str) -> str:
    """A failure reason cut to REASON_LIMIT characters: it may quote whatever a server answered."""
    return reason if len(reason) <= REASON_LIMIT else reason[:REASON_LIMIT] + "…"


async def private_allowed(url: str) -> bool:
    """Whether the owner's MCP server URL is itself on a refused address (then its sign-in may reach them)."""
    host = urlsplit(url).hostname or ""
    try:
        return refusal(str(ipaddress.ip_address(host.split("%", 1)[0]))) is not None
    except ValueError:
        pass
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return any(refusal(str(info[4][0])) is not None for info in found)


def _stream(inner: httpcore2.AsyncNetworkStream, room: list[int] | None) -> httpcore2.AsyncNetworkStream:
    import httpcore2

    class Capped(httpcore2.AsyncNetworkStream):
        """A connection that reads at most `room[0]` more bytes (None: no limit)."""

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            data = await inner.read(max_bytes, timeout)
            if room is not None:
                room[0] -= len(data)
                if room[0] < 0:
                    raise httpcore2.ReadError(f"the answer is larger than {READ_LIMIT} bytes")
            return data

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            await inner.write(buffer, timeout)

        async def aclose(self) -> None:
            await inner.aclose()

        async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                            timeout: float | None = None) -> httpcore2.AsyncNetworkStream:
            return _stream(await inner.start_tls(ssl_context, server_hostname, timeout), room)

        def get_extra_info(self, info: str) -> Any:
            return inner.get_extra_info(info)
    return Capped()


def _backend(read_limit: int | None, allow_private: bool) -> httpcore2.AsyncNetworkBackend:
    import httpcore2
    from httpcore2._backends.auto import AutoBackend
    inner = AutoBackend()

    class Checked(httpcore2.AsyncNetworkBackend):
        """Resolves once, refuses the addresses `refusal` names, and connects to the address it checked."""

        async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                              local_address: str | None = None,
                              socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
            try:
                found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise httpcore2.ConnectError(f"{host} does not resolve: {exc}") from None
            if not found:
                raise httpcore2.ConnectError(f"{host} does not resolve")
            try:
                for info in found:
                    if not allow_private:
                        check_address(host, str(info[4][0]), HINT)
            except RefusedTarget as exc:  # as an unreachable host: the SDK's discovery tries the next place
                raise httpcore2.ConnectError(str(exc)) from None
            address = str(found[0][4][0])
            stream = await inner.connect_tcp(address, port, timeout, local_address, socket_options)
            return _stream(stream, [read_limit] if read_limit is not None else None)

        async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                      socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
            raise httpcore2.ConnectError("no Unix sockets")

        async def sleep(self, seconds: float) -> None:
            await inner.sleep(seconds)
    return Checked()


async def oauth_client(url: str, *, headers: dict[str, str] | None = None, auth: httpx2.Auth | None = None,
                       read_limit: int | None = READ_LIMIT) -> httpx2.AsyncClient:
    """The SDK's client for the MCP server at `url` (its timeouts), its connections checked as above."""
    import httpcore2
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    # httpx2 takes no network backend: its pool is made again with one (the same settings otherwise).
    transport._pool = httpcore2.AsyncConnectionPool(ssl_context=httpx2.create_ssl_context(trust_env=False),
                                                    network_backend=_backend(read_limit, await private_allowed(url)))
    return httpx2.AsyncClient(headers=headers, auth=auth, transport=transport, trust_env=False,
                              timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT))
