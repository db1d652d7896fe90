"""uvicorn's h11 protocol with a deadline for a request's head: a connection whose request line and headers
are not complete within `seconds` of its opening (or of the first byte of a later keep-alive request) is
closed. uvicorn has no such timeout (`timeout_keep_alive` only covers an idle connection, and is cancelled
by the first byte), so a client sending half a request line held a connection, and a file descriptor,
forever. Bodies and WebSockets are not timed here: once the head is complete the app decides.
"""
from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT = 10.0  # seconds; `serve --header-timeout`


class HeaderTimeoutProtocol(H11Protocol):
    header_timeout: float = HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not waiting:
            self._cancel_head_timer()  # the head is complete (or the connection is going)
        elif self._head_timer is None and data:  # a later request on a kept-alive connection began
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
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


def with_header_timeout(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's `http=` with this deadline."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})
