"""What the proxy sends each way (proxy.py): a tunnel's bytes as they come, or a plain request's head
and its one body, re-framed by its own length, after which the client's bytes are read and dropped."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .heads import HEAD_LIMIT, Head
from .hosts import BadHost

CHUNK = 64 * 1024


async def stream(reader: asyncio.StreamReader, first: bytes = b"") -> AsyncIterator[bytes]:
    """`first`, then everything `reader` gives until its end."""
    if first:
        yield first
    while data := await reader.read(CHUNK):
        yield data


async def _exactly(reader: asyncio.StreamReader, size: int) -> AsyncIterator[bytes]:
    while size:
        data = await reader.read(min(size, CHUNK))
        if not data:
            raise BadHost("the request body ended early")
        size -= len(data)
        yield data


async def _chunked(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """A chunked body, each chunk re-framed as read (extensions and trailers dropped): what the host
    gets ends where this proxy read its end, whatever the client wrote past it."""
    while True:
        line = (await reader.readuntil(b"\r\n"))[:-2]
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 15 or size_text.strip(b"0123456789abcdefABCDEF"):
            raise BadHost("a malformed chunk size")
        size = int(size_text, 16)
        if not size:
            trailers = 0
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                trailers += len(line)
                if trailers > HEAD_LIMIT:
                    raise BadHost("the request's trailers are too long")
            yield b"0\r\n\r\n"
            return
        yield f"{size:x}\r\n".encode()
        async for data in _exactly(reader, size):
            yield data
        if await reader.readexactly(2) != b"\r\n":
            raise BadHost("a chunk longer than its size")
        yield b"\r\n"


async def one_request(reader: asyncio.StreamReader, head: Head) -> AsyncIterator[bytes]:
    """A plain request as it goes to its host: its rewritten head and its body; then whatever else the
    client sends (a pipelined second request) is read and dropped, so its end still passes on."""
    yield head.forward
    try:
        body = _chunked(reader) if head.chunked else _exactly(reader, head.length)
        async for data in body:
            yield data
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise BadHost("a malformed or incomplete request body") from None
    while await reader.read(CHUNK):
        pass
