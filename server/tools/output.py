"""A tool process's output and end: read it capped, wait for its exit by events, stop at a sandbox's end."""
from __future__ import annotations

import asyncio
import os

CHUNK = 16 * 1024


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


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_exit(proc: asyncio.subprocess.Process, reader: asyncio.Task[None], deadline: float) -> bool:
    """True once the process has exited, False at the deadline."""
    # Awaits events, never a timer. proc.wait() on Python 3.11 also waits for the pipes to close,
    # which a background child (`server &`) can keep open as long as it likes, so the exit itself
    # is watched through a pidfd (readable the moment the process ends); once the output has ended
    # too, proc.wait() returns as soon as the exit status is in.
    loop = asyncio.get_running_loop()
    waiter = asyncio.ensure_future(proc.wait())
    exited: asyncio.Future[None] = loop.create_future()
    pidfd = -1
    try:
        try:
            pidfd = os.pidfd_open(proc.pid)
            loop.add_reader(pidfd, _settle, exited)
        except ProcessLookupError:  # already gone: its status is on its way to `waiter`
            exited.set_result(None)
        except OSError:  # no pidfds (old kernel): look again every 50 ms while a child holds the output
            pass
        while proc.returncode is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            watched = {waiter} | ({reader} if not reader.done() else set()) | ({exited} if not exited.done() else set())
            if exited.done() and not reader.done():
                # Exited, its output still held open by a child: the status comes from the child
                # watcher's thread at once; this short wait only covers that hand-over.
                watched = {waiter, reader}
                remaining = min(remaining, 0.002)
            elif pidfd < 0 and not exited.done() and not reader.done():
                remaining = min(remaining, 0.05)
            await asyncio.wait(watched, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        return True
    finally:
        if pidfd >= 0:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        if not waiter.done():
            waiter.cancel()
