"""A lean WebSocket client for load generation: an asyncio protocol that only reads text messages.

Why not `websockets`' client: with 2,000 spectators on this 2-core machine, its per-frame work (frame
parsing in generators, UTF-8 checks, a task per connection) took about 70% of the CPU in the
fan-out benchmark, so the figures measured the load generator more than the servers. This one
parses server frames with a few slices (server frames are never masked), inflates
permessage-deflate messages with zlib, answers pings, and hands each text message to a callback
with the time its bytes arrived. It is for the benchmarks only: it trusts the server it talks to.
"""
from __future__ import annotations

import asyncio
import base64
import os
import struct
import time
import zlib
from collections.abc import Callable
from urllib.parse import urlsplit

OnMessage = Callable[[float, bytes], bool]  # (arrival time, message) -> False to close
_TAIL = b"\x00\x00\xff\xff"  # permessage-deflate strips this from every message (RFC 7692 §7.2.1)


class Connection(asyncio.Protocol):
    def __init__(self, request: bytes, on_message: OnMessage, compress: bool) -> None:
        self._request, self._on_message = request, on_message
        self._buffer = bytearray()
        self._handshaken = False
        self._inflate: zlib._Decompress | None = None
        self._fresh_context = False  # server_no_context_takeover: each message inflates from scratch
        self._fragments: list[bytes] = []
        self._compressed = False
        self._offered = compress
        self._transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc or ConnectionError("closed before the upgrade"))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.time()
        self._buffer += data
        if not self._handshaken and not self._handshake():
            return
        try:
            self._frames(now)
        except Exception as exc:  # a bug here must end this connection loudly, not hang the run
            self.close()
            if not self.closed.done():
                self.closed.set_exception(exc)

    def _handshake(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self._buffer[:end]).decode("latin-1").lower()
        del self._buffer[:end + 4]
        if not head.startswith("http/1.1 101"):
            self.opened.set_exception(ConnectionError(f"refused: {head.splitlines()[0]}"))
            self.close()
            return False
        extensions = next((line.split(":", 1)[1] for line in head.split("\r\n")
                           if line.startswith("sec-websocket-extensions:")), "")
        if self._offered and "permessage-deflate" in extensions:
            self._inflate = zlib.decompressobj(-15)
            self._fresh_context = "server_no_context_takeover" in extensions
        self._handshaken = True
        self.opened.set_result(None)
        return True

    def _frames(self, now: float) -> None:
        buffer = self._buffer
        while len(buffer) >= 2:
            first, second = buffer[0], buffer[1]
            length, start = second & 0x7F, 2
            if length == 126:
                if len(buffer) < 4:
                    return
                length, start = struct.unpack_from("!H", buffer, 2)[0], 4
            elif length == 127:
                if len(buffer) < 10:
                    return
                length, start = struct.unpack_from("!Q", buffer, 2)[0], 10
            if len(buffer) < start + length:
                return
            payload = bytes(buffer[start:start + length])
            del buffer[:start + length]
            opcode = first & 0x0F
            if opcode == 0x9:  # ping: answer at once
                self._send(0xA, payload)
            elif opcode == 0x8:  # close
                self.close()
                return
            elif opcode in (0x1, 0x2, 0x0):
                if opcode:
                    self._compressed = bool(first & 0x40)
                self._fragments.append(payload)
                if first & 0x80 and not self._message(now):
                    self.close()
                    return

    def _message(self, now: float) -> bool:
        message = b"".join(self._fragments)
        self._fragments.clear()
        if self._compressed:
            assert self._inflate is not None, "a compressed message that nobody negotiated"
            message = self._inflate.decompress(message + _TAIL)
            if self._fresh_context:
                self._inflate = zlib.decompressobj(-15)
        return self._on_message(now, message)

    def _send(self, opcode: int, payload: bytes) -> None:
        """A masked frame (every client frame is masked), for pongs and the close."""
        if self._transport is None or self._transport.is_closing():
            return
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self._transport.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    def close(self) -> None:
        self._send(0x8, struct.pack("!H", 1000))
        if self._transport is not None:
            self._transport.close()


async def connect(url: str, headers: dict[str, str], on_message: OnMessage, *, compress: bool,
                  timeout: float = 60) -> Connection:
    """Open `url` (ws://host:port/path) and hand every message to `on_message` until it returns False
    or the server closes (then `closed` is done). Raises ConnectionError when the upgrade is refused."""
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"GET {target or '/'} HTTP/1.1", f"Host: {parts.netloc}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}", "Sec-WebSocket-Version: 13",
             *(["Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits"] if compress else []),
             *(f"{name}: {value}" for name, value in headers.items())]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        _, connection = await loop.create_connection(lambda: Connection(request, on_message, compress),
                                                     parts.hostname or "127.0.0.1", parts.port or 80)
        await connection.opened
    return connection
