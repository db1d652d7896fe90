"""A tool process's output and end: read it capped, wait for its exit by events, stop at a sandbox's end."""
from __future__ import annotations

import asyncio
from typing import Any

from . import children

CHUNK = 16 * 1024
STREAM_LIMIT = 64 * 1024  # asyncio's default for a subprocess's StreamReader


class CappedOutput:
    """Keeps the head and the tail of a stream (errors are usually at the end), drops the middle."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit * 3 // 4
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            excess = len(self.tail) - self.tail_limit
            if excess > 0:
                del self.tail[:excess]
                self.dropped += excess

    def text(self) -> str:
        if not self.dropped:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        marker = f"\n[... output truncated: {self.dropped} bytes omitted ...]\n"
        return (self.head.decode("utf-8", errors="replace") + marker
                + self.tail.decode("utf-8", errors="replace"))


async def pump(stream: asyncio.StreamReader, sink: CappedOutput) -> None:
    while chunk := await stream.read(CHUNK):
        sink.feed(chunk)  # keep reading past the cap so the child never blocks on a full pipe


async def take_the_rest(reader: asyncio.Task[None], stream: asyncio.StreamReader, sink: CappedOutput) -> None:
    """Stop `reader` (a `pump`) and take what `stream` holds now, without waiting for more.

    For a process whose end means its output is complete though the pipe stays open a while (a
    sandbox: see builtin._shell_exec). Everything written before the end has reached `stream` by
    the time the end is seen: the pipe's readiness is reported with the exit's, or before it, and
    read in that loop turn. A stopped read leaves its data in `stream`, and a read of data already
    there finishes in its first step.
    """
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    while True:
        read = asyncio.ensure_future(stream.read(CHUNK))
        try:
            await asyncio.sleep(0)  # its first step runs before this one resumes
        except BaseException:  # cancelled meanwhile: leave no read behind
            read.cancel()
            raise
        if not read.done():  # nothing was there: it waits for more, which is not coming
            read.cancel()
            await asyncio.gather(read, return_exceptions=True)
            return
        chunk = read.result()
        if not chunk:
            return
        sink.feed(chunk)


class _ExitAware(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's protocol for a subprocess with pipes, which also tells the moment its exit status is in.

    `Process.wait()` returns only once the pipes have closed as well, which a sandbox's first process
    holds open while the kernel takes its namespaces down, and a background child (`server &`) as long
    as it likes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=STREAM_LIMIT, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        try:
            super().process_exited()  # the transport has set the return code by now
        finally:
            if not self.exited.done():
                self.exited.set_result(None)


class ToolProcess(asyncio.subprocess.Process):
    """A subprocess whose `exited` future is done the moment its exit status is in (`wait_exit`)."""

    def __init__(self, transport: asyncio.SubprocessTransport, protocol: _ExitAware,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(transport, protocol, loop)
        self.exited = protocol.exited


async def start_process(program: str, *args: str, stdin: int | None = None, stdout: int | None = None,
                        stderr: int | None = None, **kwargs: Any) -> ToolProcess:
    """What `asyncio.create_subprocess_exec` does (its common arguments: str arguments, pipes by number,
    `Popen`'s keywords), as a `ToolProcess`, started in a thread (children.py): the protocol and `Process`
    are asyncio's, constructed as `create_subprocess_exec` constructs them."""
    loop = asyncio.get_running_loop()
    protocol = _ExitAware(loop)
    transport = await children.start(protocol, [program, *args], stdin=stdin, stdout=stdout, stderr=stderr,
                                     **kwargs)
    return ToolProcess(transport, protocol, loop)


async def wait_exit(proc: ToolProcess, deadline: float) -> bool:
    """True once `proc` has exited, its status in `proc.returncode`; False at `deadline` (the running
    loop's clock)."""
    # Awaits the exit status itself, never a timer: a 2 ms wait for the status once the exit was seen
    # held every approved shell command 2 ms (tests/unit/test_tools.py; CHANGELOG.md, Changed).
    remaining = deadline - asyncio.get_running_loop().time()
    if not proc.exited.done() and remaining > 0:
        await asyncio.wait({proc.exited}, timeout=remaining)
    return proc.exited.done()
