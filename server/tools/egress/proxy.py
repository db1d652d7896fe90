"""The proxy a sandbox in the `ask` network mode reaches the outside through, one per running call.

It listens on a Unix socket that is bind-mounted into the sandbox (whose own network is loopback
only; forwarder.py relays the command's 127.0.0.1:3128 to it). Each connection names its host:port
(`CONNECT`, or a plain-HTTP request's URL: heads.py); the world decides whether it may go (`Gate.ask`:
its rules and grants, else a person in the approval queue, while the connection waits); then the
name is resolved here and every address checked (addresses.py), a tunnel's TLS server name must be
the host it named (tls.py), and bytes flow both ways, counted and capped per connection and per
call. Every connection, let through or refused, is recorded (`Gate.record`), with what allowed it.
Buffers are bounded: each direction reads at most 64 KiB before its write drains; a call has at most
MAX_CONNECTIONS open at once (more are answered 429, unrecorded: a loop must not flood the log).
The socket's folder is the sandbox user's alone (0700): no other local user can ask in its name.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..base import Gate, ToolContext
from ..sandbox import world_users
from .addresses import resolve
from .heads import HEAD_LIMIT, Head, parse_head
from .hosts import BadHost, host_port, is_address
from .relay import CHUNK, one_request, stream
from .tls import could_be_tls, handshake_message, server_name

logger = logging.getLogger(__name__)

PORT = 3128  # where the command finds its proxy, on the sandbox's own loopback
SOCKET_DIR = "/run/agent-world-proxy"  # where the socket's folder is mounted in the sandbox
SOCKET_NAME = "proxy.sock"
HEAD_TIMEOUT = 30.0  # seconds a connection may take to say where it goes (and a tunnel its ClientHello)
CONNECT_TIMEOUT = 15.0  # seconds for the lookup and every address tried, together
MAX_CONNECTIONS = 32  # a call's connections open (or waiting to be decided) at once
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


class Cut(Refused):
    """A connection refused after the world allowed it and it opened (said to nobody: it is closed)."""


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
        self.folder = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="agent-world-proxy-"))  # 0700
        path = self.folder / SOCKET_NAME
        self._server = await asyncio.start_unix_server(self._serve, path=str(path), limit=HEAD_LIMIT)
        os.chmod(path, 0o600)
        if os.geteuid() == 0:  # the sandbox runs as its world's user (bubblewrap.py): the folder is its alone
            uid = await asyncio.to_thread(world_users.sandbox_uid, self.ctx.workspace)
            for owned in (path, self.folder):
                os.chown(owned, uid, uid)
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
        """One connection, handled in a task of its own that the call's end cancels: the stream server's own
        task returns as usual (on 3.11 a cancelled one is logged as an error)."""
        try:
            if len(self._handlers) >= MAX_CONNECTIONS:
                writer.write(_answer(429, f"this call has {MAX_CONNECTIONS} connections open already"))
                return
            task = asyncio.ensure_future(self._handle(reader, writer))
            self._handlers.add(task)
            try:
                await asyncio.wait([task])
            finally:
                self._handlers.discard(task)
            if not task.cancelled() and (failure := task.exception()) is not None:
                # one connection's failure is its own: the others and the call go on
                logger.error("a proxied connection of %s failed", self.ctx.call_id, exc_info=failure)
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                said = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            return  # it never said where to: nothing to ask anyone, nothing to record
        record: dict[str, Any] = {"host": "", "port": 0, "decision": "refused", "reason": "", "sent": 0, "received": 0}
        try:
            try:
                head = parse_head(said)
            except BadHost as exc:
                raise Refused(str(exc), 400) from None
            record.update(host=head.host, port=head.port)
            upstream = await self._open(head, record)
            record["decision"] = "allowed"
            try:
                if head.tunnel:
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await writer.drain()
                    outgoing = stream(reader, await self._client_hello(reader, head))
                else:
                    outgoing = one_request(reader, head)
                await self._pipe(outgoing, writer, upstream, record)
            finally:
                upstream[1].close()
        except Refused as exc:
            record["reason"] = str(exc)
            if isinstance(exc, Cut):
                record["decision"] = "cut"
            elif record["decision"] == "refused":  # refused before it opened: an HTTP answer can say so
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
        passage = await self.gate.ask(self.ctx, self.tool, head.host, head.port)
        if passage.refusal:
            raise Refused(passage.refusal, passage.status)
        record.update(passage.by)
        failures = []
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):  # one deadline: a slow lookup or address uses it up
                for address in await resolve(head.host, head.port):  # each checked: connected to as it is
                    try:
                        opened = await asyncio.open_connection(str(address), head.port, limit=CHUNK)
                    except OSError as exc:
                        failures.append(f"{address}: {exc.strerror or exc}")
                        continue
                    record["address"] = str(address)
                    return opened
        except BadHost as exc:
            raise Refused(str(exc)) from None
        except TimeoutError:
            failures.append(f"no answer within {CONNECT_TIMEOUT:g} s")
        raise Refused(f"could not connect to {host_port(head.host, head.port)} ({'; '.join(failures)})", 502)

    async def _client_hello(self, reader: asyncio.StreamReader, head: Head) -> bytes:
        """A tunnel's first bytes; where they start TLS (even one byte of it), the whole ClientHello,
        however many reads and records it comes in, whose server name must be the host the tunnel was
        asked for (and a tunnel to a host name must name one). Raises Cut."""
        first = b""
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                while more := await reader.read(CHUNK):
                    first += more
                    if not could_be_tls(first) or handshake_message(first) is not None:
                        break
        except ValueError:
            pass  # said below
        except TimeoutError:
            if not first:
                raise Cut("the tunnel sent nothing") from None
        if not could_be_tls(first):
            return first
        try:
            name = server_name(first)
        except ValueError as exc:
            raise Cut(f"the tunnel's TLS hello is unreadable: {exc}") from None
        if name is None and not is_address(head.host):
            raise Cut(f"the TLS hello names no server (SNI); the tunnel was allowed to {head.host} only")
        if name is not None and name != head.host:
            raise Cut(f"the TLS server name {name[:100]} is not {head.host}, the host the tunnel was allowed to")
        return first

    async def _pipe(self, outgoing: AsyncIterator[bytes], writer: asyncio.StreamWriter,
                    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter], record: dict[str, Any]) -> None:
        """Both ways until both ends are done, or a byte cap is reached (then both are cut)."""
        async def copy(chunks: AsyncIterator[bytes], target: asyncio.StreamWriter, key: str) -> None:
            async for data in chunks:
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
            if target.can_write_eof():
                target.write_eof()  # half-closed: the other way may still be talking

        sending = asyncio.ensure_future(copy(outgoing, upstream[1], "sent"))
        receiving = asyncio.ensure_future(copy(stream(upstream[0]), writer, "received"))
        try:
            for done in asyncio.as_completed((sending, receiving)):
                try:
                    await done
                except ConnectionError:
                    break  # one end went away: the other is cut too
                except BadHost as exc:  # a plain request's body that this proxy and a server could read apart
                    raise Cut(str(exc)) from None
        finally:
            for task in (sending, receiving):
                task.cancel()
            await asyncio.gather(sending, receiving, return_exceptions=True)
