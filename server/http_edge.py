"""The HTTP edge of `serve`: what uvicorn's h11 protocol lacks against clients that hold connections.

- A deadline for a request's head: a connection whose request line and headers are not complete within
  `header_timeout` of its opening (or of the first byte of a later keep-alive request) is closed. uvicorn
  has no such timeout (`timeout_keep_alive` only covers an idle connection, and is cancelled by the first
  byte), so a client sending half a request line held a connection, and a file descriptor, forever.
  Bodies and WebSockets are not timed here: once the head is complete the app decides.
- A cap on the connections one address holds open at once (WebSockets included): past it, a new one is
  answered 503 and closed before anything of it is read. One client could otherwise take every file
  descriptor of the process. The reverse proxy's own addresses (`--forwarded-allow-ips`) are not capped:
  every visitor comes through them, and the proxy caps per visitor (deploy/nginx.conf `limit_conn`).
- A long WebSocket message goes out in fragments, one a turn of the event loop (`FRAGMENT`).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import time
from collections import Counter
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState

from .aio import next_turn

logger = logging.getLogger(__name__)
HEADER_TIMEOUT = 10.0  # seconds; `serve --header-timeout`
REFUSALS_LOGGED_EVERY = 60.0  # seconds: one line an address at most, with how many were refused since
# A WebSocket message longer than this (characters of text, or bytes) is sent as fragments of this size, one
# a turn of the event loop. Written whole, a finished 1 MB reply (a 4 MB frame to each of its pages) or a
# 16 MiB tool result on a JSON socket held the loop 10-60 ms (encoded, framed and copied into the transport's
# buffer in one go) while every other world waited. Control frames (pings, pongs, a close) may come between
# fragments (RFC 6455 5.4); other messages wait for the whole of it.
FRAGMENT = 256 * 1024
_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
            b"Retry-After: 5\r\nContent-Length: 58\r\n\r\ntoo many connections open from your address: close some\n")


class ConnectionCounts:
    """Open connections per peer address, shared by the HTTP and WebSocket protocols of one server."""

    def __init__(self, cap: int, uncapped: str = "") -> None:
        self.cap = cap
        self._open: Counter[str] = Counter()
        self._held: dict[asyncio.BaseTransport, str] = {}  # each counted connection, until it is lost
        self._uncapped = _networks(uncapped)
        self._refusals: dict[str, tuple[float, int]] = {}  # address: (when last logged, refused since)
        self._pruned = -math.inf

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Count `transport` in, or say no (its address holds `cap` already)."""
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not address or self.cap <= 0 or self._is_uncapped(address):
            return True
        if self._open[address] >= self.cap:
            self._refused(address)
            return False
        self._open[address] += 1
        self._held[transport] = address
        return True

    def _refused(self, address: str) -> None:
        """On the record, for the operator: an address at its cap is a client gone wrong, or one to allow."""
        now = time.monotonic()
        logged, since = self._refusals.get(address, (-math.inf, 0))
        since += 1
        if now - logged >= REFUSALS_LOGGED_EVERY:
            logger.warning("refused %d connection(s) from %s: it holds %d open, its cap (--connections-per-address)",
                           since, address, self.cap)
            logged, since = now, 0
        self._refusals[address] = (logged, since)
        if len(self._refusals) > 10_000 and now - self._pruned >= REFUSALS_LOGGED_EVERY:
            self._pruned = now  # addresses quiet for a while are forgotten (once a minute at most)
            self._refusals = {a: r for a, r in self._refusals.items() if now - r[0] < REFUSALS_LOGGED_EVERY}

    def release(self, transport: asyncio.BaseTransport | None) -> None:
        address = self._held.pop(transport, None) if transport is not None else None
        if address is not None:
            self._open[address] -= 1
            if self._open[address] <= 0:
                del self._open[address]

    def _is_uncapped(self, address: str) -> bool:
        if self._uncapped is None:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:  # a Unix socket's path, say: no address to count by
            return True
        return any(ip in network for network in self._uncapped)


def _networks(spec: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network] | None:
    """`--forwarded-allow-ips` as networks (None for `*`: every address)."""
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if "*" in parts:
        return None
    networks = []
    for part in parts:
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            continue  # a host name or a Unix socket: uvicorn's own check matches those, never an address here
    return networks


class EdgeProtocol(H11Protocol):
    header_timeout: float = HEADER_TIMEOUT
    counts: ConnectionCounts = ConnectionCounts(0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self.counts.admit(transport):
            self._refused = True
            transport.write(_REFUSED)
            transport.close()
            return
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # nothing of it is read
        super().data_received(data)
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not waiting:
            self._cancel_head_timer()  # the head is complete (or the connection is going)
        elif self._head_timer is None and data:  # a later request on a kept-alive connection began
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        # (A connection upgraded to a WebSocket ends in EdgeWebSocketProtocol's, not here.)
        self._cancel_head_timer()
        if not self._refused:
            self.counts.release(self.transport)
            super().connection_lost(exc)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.debug("closed a connection whose request head took over %g s", self.header_timeout)
            self.transport.close()


class EdgeWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's default WebSocket protocol, releasing its connection's count when it ends, and able to
    end a connection behind what is buffered for it (`seal`)."""
    counts: ConnectionCounts = ConnectionCounts(0)
    sealed = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._message = asyncio.Lock()  # one message at a time: a fragmented one is never interleaved

    def seal(self, frame: bytes, grace: float) -> None:
        """Write `frame` (a close frame) behind what is buffered, then the end of the stream, and from then on
        read and drop what the client sends. Closing the socket instead left a slow client's ping unread,
        and the kernel then reset the connection: the client lost the close frame and the frames before it
        (1006, no `after=N` to resume from). Closed when the client ends its side; aborted after `grace`."""
        self.sealed = True
        self.stop_keepalive()
        self.transport.write(frame)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        # (as a close timer, it also keeps uvicorn from closing the transport when the app returns)
        self.close_timer = self.loop.call_later(grace, self.transport.abort)

    def data_received(self, data: bytes) -> None:
        if not self.sealed:
            super().data_received(data)

    async def send(self, message: Any) -> None:
        async with self._message:
            if self.sealed:  # (nothing goes after the close frame)
                return
            payload = None
            if message["type"] == "websocket.send":  # (bytes first, as uvicorn takes them)
                payload = message["bytes"] if message.get("bytes") is not None else message.get("text")
            if (payload is None or len(payload) <= FRAGMENT or not self.handshake_complete or self.close_sent
                    or self.initial_response is not None or self.conn.extensions):
                await super().send(message)
            else:
                await self._send_fragments(payload)

    async def _send_fragments(self, payload: str | bytes) -> None:
        """`payload` as one message in fragments, each written once the transport has room, in a turn of
        its own. A message once begun is ended: cancelled halfway, the rest goes at once (a client must
        not get half of one message glued to the next)."""
        text = isinstance(payload, str)
        at = 0
        try:
            while at < len(payload):
                if at:
                    await next_turn()
                await self.writable.wait()
                if self.disconnected or self.sealed:
                    raise ClientDisconnected()
                end = at + FRAGMENT
                self._write_fragment(payload[at:end], first=at == 0, last=end >= len(payload), text=text)
                at = end
        except BaseException:
            if 0 < at < len(payload) and not (self.disconnected or self.sealed or self.transport.is_closing()):
                try:  # (at once, whatever the client's backlog: rare, and the bound then sees it)
                    self._write_fragment(payload[at:], first=False, last=True, text=text)
                except Exception:  # a message that cannot be ended leaves a connection nothing can follow
                    self.transport.abort()
            raise

    def _write_fragment(self, piece: str | bytes, *, first: bool, last: bool, text: bool) -> None:
        data = piece.encode() if isinstance(piece, str) else piece
        try:
            if not first:
                self.conn.send_continuation(data, fin=last)
            elif text:
                self.conn.send_text(data, fin=last)
            else:
                self.conn.send_binary(data, fin=last)
        except InvalidState:
            raise ClientDisconnected() from None
        self.transport.write(b"".join(self.conn.data_to_send()))

    def shutdown(self) -> None:
        if self.sealed:
            self.transport.close()
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self.counts.release(self.transport)
        super().connection_lost(exc)


def edge_protocols(header_timeout: float, per_address: int, proxies: str
                   ) -> tuple[type[EdgeProtocol], type[EdgeWebSocketProtocol]]:
    """uvicorn's `http=` and `ws=` classes with this deadline and cap (`proxies`: never capped)."""
    counts = ConnectionCounts(per_address, proxies)
    http = type("EdgeProtocol", (EdgeProtocol,), {"header_timeout": header_timeout, "counts": counts})
    ws = type("EdgeWebSocketProtocol", (EdgeWebSocketProtocol,), {"counts": counts})
    return http, ws
