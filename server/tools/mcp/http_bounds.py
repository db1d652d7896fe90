"""The read bound of a streamable-HTTP MCP server's messages (issue #30), as stdio.py's for a stdio server's lines.

The SDK reads a JSON response body whole (`response.aread()`) and an SSE event whole before anything looks at
its size. A response hook wraps each response's byte stream: a JSON body (any body not `text/event-stream`)
is read up to `limit()` bytes, and an SSE stream up to `limit()` bytes of one event (the count starts again
at each blank line, so a long-lived stream of small events is never cut by its total). Past it the stream
fails with an error the SDK turns into the request's answer: a body's as a `StreamError` ("Failed to parse
JSON response: …"), an event's as an `SSEError` ("SSE stream failed: …"). The rest is never read.

Bytes are counted as they arrive, so the client asks for them uncompressed; a body compressed anyway
(its size unknowable until decoded) is refused unread.
"""
from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable

import httpx2

from .stdio import too_large

# A blank line: two line ends in a row (`\r\n` is one line end, so `\r\n\r\n` is found as its `\n\r`).
_BOUNDARY = re.compile(rb"\n\n|\r\r|\n\r")
IDENTITY = {"Accept-Encoding": "identity"}  # sent with every request: the bytes counted are the bytes held


class BodyTooLarge(httpx2.StreamError):
    """A JSON response body past the bound: the SDK answers the request with this message."""


class EventTooLarge(httpx2.SSEError):
    """One SSE event past the bound: the SDK answers the request the stream was for with this message."""


class ResponseBound:
    """The response hook of an MCP server's HTTP client: each response's bytes go through a `BoundedStream`."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self.limit = limit  # read at every chunk: a world's setting can change while the server runs
        self.max_buffered = 0  # the most bytes of one message let through (never over the limit)
        self.passed = 0  # bytes let through in all, of every response

    async def __call__(self, response: httpx2.Response) -> None:
        encoding = response.headers.get("content-encoding", "").strip().lower()
        refused = None if encoding in ("", "identity") else (
            f"the MCP server sent a body compressed with {encoding!r} though asked for none: "
            "its size is not known until it is held whole, so it was not read")
        content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        assert isinstance(response.stream, httpx2.AsyncByteStream), "an async client's response"
        response.stream = BoundedStream(response.stream, self, events=content_type == "text/event-stream",
                                        refused=refused)


class BoundedStream(httpx2.AsyncByteStream):
    """A response's bytes, failing once one message (the body, or one SSE event) passes the bound."""

    def __init__(self, inner: httpx2.AsyncByteStream, bound: ResponseBound, *, events: bool,
                 refused: str | None = None) -> None:
        self.inner = inner
        self.bound = bound
        self.events = events
        self.refused = refused  # why this body is not read at all
        self._since = 0  # bytes of the message in progress: since the last blank line, or of the whole body
        self._last = b""  # the previous chunk's last byte: a blank line may straddle two chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.refused is not None:
            raise BodyTooLarge(self.refused)
        async for chunk in self.inner:
            self._count(chunk)
            self.bound.passed += len(chunk)
            yield chunk

    def _count(self, chunk: bytes) -> None:
        if not self.events:
            self._since += len(chunk)
            self._check(self._since)
            return
        window = self._last + chunk
        size, previous = self._since, len(self._last)  # the window's first byte was counted with the last chunk
        for boundary in _BOUNDARY.finditer(window):
            size += boundary.end() - previous
            self._check(size)  # each event this chunk ends
            size, previous = 0, boundary.end()
        self._since, self._last = size + len(window) - previous, window[-1:]
        self._check(self._since)

    def _check(self, size: int) -> None:
        limit = self.bound.limit()
        if size > limit:
            reason = too_large(f"more than {limit}", limit)
            raise EventTooLarge(reason) if self.events else BodyTooLarge(reason)
        self.bound.max_buffered = max(self.bound.max_buffered, size)

    async def aclose(self) -> None:
        await self.inner.aclose()
