"""The count behind an HTTP MCP server's message bound (server/tools/mcp/http_bounds.py): an SSE event is
counted from the last blank line, whichever line ends it uses and however the chunks split it; any other
body as a whole; a body compressed anyway is refused unread."""
from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest

from server.tools.mcp.http_bounds import BodyTooLarge, EventTooLarge, ResponseBound

LIMIT = 50


class Chunks(httpx2.AsyncByteStream):
    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


async def _read(content_type: str, *chunks: bytes, encoding: str = "") -> tuple[bytes, ResponseBound]:
    bound = ResponseBound(lambda: LIMIT)
    headers = {"content-type": content_type} | ({"content-encoding": encoding} if encoding else {})
    response = httpx2.Response(200, headers=headers, stream=Chunks(*chunks))
    await bound(response)
    return await response.aread(), bound


@pytest.mark.parametrize("end", [b"\n\n", b"\r\n\r\n", b"\r\r", b"\r\n\n"])
async def test_many_small_events_pass_whatever_their_total_and_line_ends(end: bytes) -> None:
    event = b"data: " + b"x" * 30 + end
    stream = event * 20
    chunks = [stream[i:i + 7] for i in range(0, len(stream), 7)]  # boundaries straddle chunks
    body, bound = await _read("text/event-stream", *chunks)
    assert body == stream and bound.passed == len(stream) > LIMIT
    assert bound.max_buffered <= len(event) + 1


async def test_one_event_over_the_bound_fails_however_it_is_split() -> None:
    with pytest.raises(EventTooLarge, match=f"more than {LIMIT} bytes, over the {LIMIT} read"):
        await _read("text/event-stream", b"data: a\n\ndata: " + b"x" * 30, b"x" * 30 + b"\n\n")
    with pytest.raises(EventTooLarge):  # whole in one chunk, between two small ones
        await _read("text/event-stream; charset=utf-8", b"data: a\n\ndata: " + b"x" * 60 + b"\n\ndata: b\n\n")


async def test_a_body_is_counted_whole_and_a_compressed_one_is_refused_unread() -> None:
    assert (await _read("application/json", b"x" * 25, b"\n\n", b"x" * 23))[1].max_buffered == LIMIT
    with pytest.raises(BodyTooLarge, match=f"more than {LIMIT} bytes"):
        await _read("application/json", b"x" * 25, b"\n\n", b"x" * 24)
    with pytest.raises(BodyTooLarge, match="compressed with 'gzip'"):
        await _read("application/json", b"x", encoding="gzip")
