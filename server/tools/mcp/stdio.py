"""The stdio transport to an MCP server: the SDK's `stdio_client` with a reader of our own (issue #30).

The SDK's reader joins its buffer to every chunk and splits the lot again (quadratic in a line's length,
on the event loop: a 20 MB result held it for seconds), and keeps a line of any size in memory. Ours
splits only the new chunk, keeps at most `message_limit` bytes of a line (the rest of a longer one is
counted and dropped as it streams in, and the request it answers gets an error), and parses a large
line in a worker process (server/offload.py: pydantic holds the GIL, 130 ms for a 16 MiB result).
The process is started and stopped by the SDK's own helpers: the same environment, process group,
stderr file, and shutdown (close stdin, wait, then kill the tree, shielded and bounded).
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO

from ... import offload

if TYPE_CHECKING:  # imported where first used (a server connecting): `import mcp` costs ~2 s of startup
    from mcp import StdioServerParameters
    from mcp.shared.message import SessionMessage

logger = logging.getLogger(__name__)

JSON_OVERHEAD = 64 * 1024  # bytes of a message line beyond its content: the envelope, descriptions, metadata
LARGE_LINE = 64 * 1024  # bytes of a line parsed on the event loop; a longer one is parsed in a worker
_ENDS = 4096  # bytes kept of both ends of an over-long line: where its request id is
_PENDING = 1024  # request ids remembered as awaiting an answer (the oldest is forgotten past it)
# The id of a response: first in the object (after "jsonrpc", as the Python SDK writes it) or last (TypeScript).
_ID = rb'"id"\s*:\s*(-?\d+|"[^"\\]{0,200}")'
_HEAD_ID = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?' + _ID
                      + rb'(?=\s*[,}])(?!\s*,\s*"method")')  # the whole id, not a request's
_TAIL_ID = re.compile(_ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*\Z')


def message_limit(result_limit: int) -> int:
    """Bytes of one message line read from a stdio server whose results are kept to `result_limit` bytes.
    Four times the limit: servers repeat a result's text as structured content (2x), JSON escapes quotes,
    backslashes and control characters, and base64 makes binary 4/3 its size; plus the envelope."""
    return 4 * result_limit + JSON_OVERHEAD


def too_large(size: str, limit: int) -> str:
    """Why a message of `size` bytes was not read (over `limit`), as the call that awaited it is told."""
    return (f"the MCP server sent a message of {size} bytes, over the {limit} read from it "
            f"(4 x the world's mcp_result_limit + {JSON_OVERHEAD // 1024} KiB); it was not read")


@dataclass(frozen=True)
class Oversized:
    """A line longer than the limit: its size and its two ends, the rest unread."""
    size: int
    limit: int
    head: bytes
    tail: bytes

    def request_id(self) -> int | str | None:
        """The id of the response this line was, when either end shows it."""
        match = _HEAD_ID.match(self.head) or _TAIL_ID.search(self.tail)
        if match is None:
            return None
        value = json.loads(match[1])
        return value if isinstance(value, int | str) else None


@dataclass(frozen=True)
class Pieces:
    """A line over LARGE_LINE, as the chunks it came in: joined where it is parsed, in a worker (joining
    a 40 MB line on the loop held every world about 15 ms)."""
    parts: tuple[bytes, ...]

    def joined(self) -> bytes:
        return b"".join(self.parts)


class LineReader:
    """Splits a byte stream into lines in linear time, holding at most `limit()` bytes of any one line."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self.limit = limit  # read at every chunk: a world's setting can change while the server runs
        self.max_buffered = 0  # the most bytes of one line held at once (never over the limit)
        self._parts: list[bytes] = []
        self._size = 0  # bytes in _parts
        self._over: tuple[int, bytes, bytes] | None = None  # (size, head, tail) of a line past the limit

    def feed(self, chunk: bytes) -> list[bytes | Pieces | Oversized]:
        """The lines `chunk` completes (without their newline)."""
        lines: list[bytes | Pieces | Oversized] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._add(chunk[start:] if end < 0 else chunk[start:end])
            if end < 0:
                return lines
            lines.append(self._take())
            start = end + 1

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        if self._over is not None:
            size, head, tail = self._over
            self._over = (size + len(piece), head, (tail + piece[-_ENDS:])[-_ENDS:])
            return
        if self._size + len(piece) <= self.limit():
            self._parts.append(piece)
            self._size += len(piece)
            self.max_buffered = max(self.max_buffered, self._size)
            return
        held = b"".join(self._parts)  # once per over-long line; from here on only its ends are kept
        head, tail = (held + piece[:_ENDS])[:_ENDS], (held[-_ENDS:] + piece[-_ENDS:])[-_ENDS:]
        self._over = (self._size + len(piece), head, tail)
        self._parts, self._size = [], 0

    def _take(self) -> bytes | Pieces | Oversized:
        if self._over is not None:
            size, head, tail = self._over
            self._over = None
            return Oversized(size, self.limit(), head, tail)
        parts, size = self._parts, self._size
        self._parts, self._size = [], 0
        return Pieces(tuple(parts)) if size > LARGE_LINE else b"".join(parts)


def _parse(line: bytes | Pieces) -> SessionMessage | ValueError | None:
    """One line as a message (None for a blank one); a line that is not one is returned as the error, for
    the session to log."""
    import mcp_types
    from mcp.shared.message import SessionMessage
    if isinstance(line, Pieces):
        line = line.joined()
    if not line.strip():
        return None
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return ValueError(str(exc))  # (plainly: pydantic's own errors do not all survive the trip back)


def _refusal(line: Oversized, pending: dict[int | str, None]) -> SessionMessage | None:
    """The error answering the request an over-long line answered, if that request is known and waiting."""
    import mcp_types
    from mcp.shared.message import SessionMessage
    request = line.request_id()
    logger.warning("an MCP server sent a message of %d bytes, over the %d read (request %s)",
                   line.size, line.limit, request)
    if request is None or request not in pending:
        return None  # a notification, a request of the server's, or an id we cannot see: dropped
    del pending[request]
    error = mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message=too_large(str(line.size), line.limit))
    return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request, error=error))


@asynccontextmanager
async def stdio_transport(server: StdioServerParameters, errlog: TextIO,
                          reader: LineReader) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server and connect to it over stdin/stdout, as `mcp.stdio_client` does (and with its helpers)."""
    import anyio
    import anyio.lowlevel
    import mcp_types
    from mcp.client import stdio as sdk
    from mcp.shared.message import SessionMessage

    command = await sdk._get_executable_command(server.command)
    process = await sdk._create_platform_compatible_process(
        command=command, args=server.args, env=sdk.get_default_environment() | (server.env or {}),
        errlog=errlog, cwd=server.cwd)
    # The process runs: no awaits until the task group is entered, or a cancel in the gap would leak it.
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    pending: dict[int | str, None] = {}  # our requests not answered yet (an over-long answer is refused by id)
    shutting_down = False
    writer_done = anyio.Event()

    async def message(line: bytes | Pieces | Oversized) -> SessionMessage | Exception | None:
        if isinstance(line, Oversized):
            return _refusal(line, pending)
        item = await offload.run(partial(_parse, line)) if isinstance(line, Pieces) else _parse(line)
        if isinstance(item, ValueError):
            logger.warning("an MCP server sent a line that is not a JSON-RPC message: %s", item)
        if isinstance(item, SessionMessage) and isinstance(item.message, mcp_types.JSONRPCResponse
                                                           | mcp_types.JSONRPCError):
            pending.pop(item.message.id, None)  # type: ignore[arg-type]  # an error's id may be None
        return item

    async def stdout_reader() -> None:
        assert process.stdout, "the server is started with pipes"
        try:
            async with read_stream_writer:
                try:
                    while True:
                        try:
                            chunk = await process.stdout.receive()
                        except anyio.EndOfStream:
                            return
                        for line in reader.feed(chunk):  # one line at a time: no read-ahead while one waits
                            item = await message(line)
                            if item is None:
                                continue
                            try:
                                await read_stream_writer.send(item)
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return  # the session is gone; only the drain below remains
                finally:
                    await sdk._drain_stdout(process)
        except anyio.ClosedResourceError:
            pass  # our own shutdown closed stdout under the read
        except (anyio.BrokenResourceError, ConnectionError):
            if not shutting_down:
                logger.exception("reading from the MCP server's stdout failed mid-session")

    async def stdin_writer() -> None:
        assert process.stdin, "the server is started with pipes"
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    sent = session_message.message
                    if isinstance(sent, mcp_types.JSONRPCRequest):
                        pending[sent.id] = None
                        if len(pending) > _PENDING:
                            del pending[next(iter(pending))]
                    data = sent.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode(server.encoding, server.encoding_error_handler))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_stream_writer.aclose()  # the session sees the connection end, not a request hang
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()  # the reader drains: a server blocked writing stdout cannot read its stdin
        write_stream.close()
        with anyio.move_on_after(sdk._WRITER_FLUSH_TIMEOUT) as flush_scope:
            await writer_done.wait()
        if flush_scope.cancelled_caught:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        await sdk._stop_server_process(process)
        await sdk._aclose_all(read_stream, write_stream, read_stream_writer, write_stream_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):  # every wait inside is bounded; the server must not leak
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
