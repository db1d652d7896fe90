"""The proxy a sandbox in the `ask` network mode reaches the outside through, one per running call.

It listens on a Unix socket that is bind-mounted into the sandbox (whose own network is loopback
only; forwarder.py relays the command's 127.0.0.1:3128 to it). Each connection names its host:port
(`CONNECT`, or a plain-HTTP request's URL: heads.py); the world decides whether it may go (`Gate.ask`:
its rules and grants, else a person in the approval queue, while the connection waits); then the
name is resolved here and every address checked (addresses.py), a tunnel's TLS server name must be
the host it named (tls.py), and bytes flow both ways, counted and capped per connection and per
call. Every connection, let through or refused, is recorded (`Gate.record`). Buffers are bounded:
each direction reads at most 64 KiB before its write drains.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..base import Gate, ToolContext
from .addresses import resolve
from .heads import HEAD_LIMIT, Head, parse_head
from .hosts import BadHost, host_port
from .tls import RECORD_LIMIT, is_tls, record_length, server_name

logger = logging.getLogger(__name__)

PORT = 3128  # where the command finds its proxy, on the sandbox's own loopback
SOCKET_DIR = "/run/agent-world-proxy"  # where the socket's folder is mounted in the sandbox
SOCKET_NAME = "proxy.sock"
HEAD_TIMEOUT = 30.0  # seconds a connection may take to say where it goes (and a tunnel its ClientHello)
CONNECT_TIMEOUT = 15.0
CHUNK = 64 * 1024
DEFAULT_CONNECTION_BYTES = 256 << 20  # `network_connection_bytes`: both ways, per connection
DEFAULT_CALL_BYTES = 1 << 30  # `network_call_bytes`: both ways, all of one call's connections


def proxy_env() -> dict[str, str]:
    """The environment that points a command's HTTP clients at its proxy."""
    url = f"http://127.0.0.1:{PORT}"
    local = "localhost,127.0.0.1,::1"
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
            "ALL_PROXY": url, "all_proxy": url, "NO_PROXY": local, "no_proxy": local}


class Refused(Exception):
    """Why a connection is not let through (said to the command, and recorded)."""

    def __init__(self, reason: str, status: int = 403) -> None:
        super().__init__(reason)
        self.status = status


def _answer(status: int, reason: str) -> bytes:
    """An HTTP error whose status line carries the reason: a client that shows only that line (a failed
    CONNECT in urllib, curl) still says why."""
    phrase = "".join(c if " " <= c <= "~" else "?" for c in reason)[:300]
    body = f"agent-world proxy: {phrase}\n".encode()
    return (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


class CallProxy:
    """The proxy of one call: `async with CallProxy(...) as proxy:` run the sandbox with `proxy.folder`."""

    def __init__(self, ctx: ToolContext, tool: str, gate: Gate, *, connection_bytes: int = DEFAULT_CONNECTION_BYTES,
                 call_bytes: int = DEFAULT_CALL_BYTES) -> None:
        self.ctx, self.tool, self.gate = ctx, tool, gate
        self.connection_bytes, self.call_bytes = connection_bytes, call_bytes
        self.used = 0  # bytes of all this call's connections, both ways
        self.folder = Path()
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> CallProxy:
        self.folder = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="agent-world-proxy-"))
        os.chmod(self.folder, 0o755)  # the sandbox user walks to the socket
        path = self.folder / SOCKET_NAME
        self._server = await asyncio.start_unix_server(self._serve, path=str(path), limit=HEAD_LIMIT)
        os.chmod(path, 0o666)  # and may connect to it (its own folder holds nothing else)
        return self

    async def __aexit__(self, *_: object) -> None:
        """Stop listening; a connection still open (or still waiting for a person) ends with the call."""
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await asyncio.to_thread(shutil.rmtree, self.folder, True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._handle(reader, writer)
        except Exception:  # one connection's failure is its own: the others and the call go on
            logger.exception("a proxied connection of %s failed", self.ctx.call_id)
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                head = parse_head(await reader.readuntil(b"\r\n\r\n"))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            return  # it never said where to: nothing to ask anyone, nothing to record
        except BadHost as exc:
            writer.write(_answer(400, str(exc)))
            return
        record: dict[str, Any] = {"host": head.host, "port": head.port, "decision": "refused", "reason": "",
                                  "sent": 0, "received": 0}
        try:
            upstream = await self._open(head, record)
            record["decision"] = "allowed"
            try:
                if head.tunnel:
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await writer.drain()
                    first = await self._client_hello(reader, head)
                else:
                    first = head.forward
                await self._pipe(reader, writer, upstream, first, record)
            finally:
                upstream[1].close()
        except Refused as exc:
            record["reason"] = str(exc)
            if record["decision"] == "refused":  # refused before the tunnel opened: an HTTP answer can say so
                with contextlib.suppress(ConnectionError):
                    writer.write(_answer(exc.status, str(exc)))
                    await writer.drain()
        finally:
            # Recorded even when the call ends meanwhile (cancelled): shielded, so the write is not cut short.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(self.gate.record(self.ctx, self.tool, record))

    async def _open(self, head: Head, record: dict[str, Any]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Asked, resolved, checked and connected; or Refused saying why."""
        if self.used >= self.call_bytes:
            raise Refused(f"this call has used its {self.call_bytes} bytes of network (network_call_bytes)")
        refusal = await self.gate.ask(self.ctx, self.tool, head.host, head.port)
        if refusal:
            raise Refused(refusal)
        try:
            addresses = await resolve(head.host, head.port)
        except BadHost as exc:
            raise Refused(str(exc)) from None
        failures = []
        for address in addresses:  # each checked already: connected to as it is, no second lookup
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    opened = await asyncio.open_connection(str(address), head.port, limit=CHUNK)
                record["address"] = str(address)
                return opened
            except (OSError, TimeoutError) as exc:
                said = exc.strerror if isinstance(exc, OSError) and exc.strerror else "timed out"
                failures.append(f"{address}: {said}")
        raise Refused(f"could not connect to {host_port(head.host, head.port)} ({'; '.join(failures)})", 502)

    async def _client_hello(self, reader: asyncio.StreamReader, head: Head) -> bytes:
        """A tunnel's first bytes; where they start TLS, its whole first record, whose server name (if it
        names one) must be the host the tunnel was asked for. Raises Refused."""
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                first = await reader.read(CHUNK)
                while is_tls(first) and len(first) < min(record_length(first) or 5, RECORD_LIMIT):
                    more = await reader.read(CHUNK)
                    if not more:
                        break
                    first += more
        except TimeoutError:
            raise Refused("the tunnel sent nothing") from None
        if not is_tls(first):
            return first
        try:
            name = server_name(first)
        except ValueError as exc:
            raise Refused(f"the tunnel's TLS hello is unreadable: {exc}") from None
        if name is not None and name != head.host:
            raise Refused(f"the TLS server name {name[:100]} is not {head.host}, the host the tunnel was allowed to")
        return first

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter], first: bytes,
                    record: dict[str, Any]) -> None:
        """Both ways until both ends are done, or a byte cap is reached (then both are cut)."""
        async def copy(source: asyncio.StreamReader, target: asyncio.StreamWriter, key: str, data: bytes) -> None:
            while data or (data := await source.read(CHUNK)):
                connection_room = self.connection_bytes - record["sent"] - record["received"]
                room = min(connection_room, self.call_bytes - self.used)
                taken = data[:max(room, 0)]
                record[key] += len(taken)
                self.used += len(taken)
                target.write(taken)
                await target.drain()
                if len(taken) < len(data):
                    which = "network_connection_bytes" if room == connection_room else "network_call_bytes"
                    raise Refused(f"cut off at the byte cap ({which})")
                data = b""
            if target.can_write_eof():
                target.write_eof()  # half-closed: the other way may still be talking

        outgoing = asyncio.ensure_future(copy(reader, upstream[1], "sent", first))
        incoming = asyncio.ensure_future(copy(upstream[0], writer, "received", b""))
        try:
            for done in asyncio.as_completed((outgoing, incoming)):
                try:
                    await done
                except ConnectionError:
                    break  # one end went away: the other is cut too
        finally:
            for task in (outgoing, incoming):
                task.cancel()
            await asyncio.gather(outgoing, incoming, return_exceptions=True)
