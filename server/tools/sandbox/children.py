"""A tool's process: started in a thread, and its exit learned through a pidfd, not a thread per process.

Starting a process holds the thread that starts it until the child has called `exec` (vfork, then the
child's own set-up): 8-15 ms of the event loop on a loaded machine, for every command of every world,
while every other world waited. `start` has a thread of its own do it (the GIL is released meanwhile)
and wraps the process in asyncio's own subprocess transport.

Python 3.11's default child watcher starts a thread for every subprocess and waits for it to run
before `create_subprocess_exec` returns: 2-8 ms on a loaded machine, on the path from an approval
to the tool's result. Python 3.12 watches pidfds on its own; on 3.11 this installs the same watcher
(its `PidfdChildWatcher` is tied to one loop, so it is written here for whichever loop is running),
for what asyncio itself starts (an MCP server over stdio).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import warnings
from asyncio import base_subprocess
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVarTuple, Unpack

logger = logging.getLogger(__name__)
_Ts = TypeVarTuple("_Ts")
# Threads of their own (not behind the default executor's queue), never shut down before the process ends:
# a child's parent-death signal (bubblewrap's --die-with-parent) follows the thread that started it.
_starters = ThreadPoolExecutor(4, thread_name_prefix="process-start")


async def start(protocol: asyncio.SubprocessProtocol, args: list[str], *, stdin: int | None,
                stdout: int | None, stderr: int | None, **popen: Any) -> asyncio.SubprocessTransport:
    """`args` started in a thread (`Popen`'s keywords), as asyncio's transport of it, its pipes connected.
    Raises OSError when it cannot start. Cancelled while it starts, the process is killed and reaped."""
    loop = asyncio.get_running_loop()
    job = _starters.submit(_popen, args, stdin=stdin, stdout=stdout, stderr=stderr, **popen)
    try:
        process = await asyncio.shield(asyncio.wrap_future(job))
    except asyncio.CancelledError:
        if not job.cancel():  # (a start not begun yet never begins)
            job.add_done_callback(_discard_unwanted)
        raise
    try:
        connected = loop.create_future()
        transport = _StartedInThread(loop, protocol, args, False, stdin, stdout, stderr, 0, waiter=connected,
                                     started=process)
        watch_exit(loop, process.pid, lambda _pid, code: transport._process_exited(code))
    except BaseException:
        _starters.submit(_discard, process)
        raise
    try:
        await connected
    except BaseException:
        _kill(process)
        transport.close()
        await transport._wait()
        raise
    return transport


def _popen(args: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, bufsize=0, **popen)  # (unbuffered: asyncio's pipe transports read the files)


class _StartedInThread(base_subprocess.BaseSubprocessTransport):
    """asyncio's own subprocess transport (pipes, exit, signals), around a process `start` made."""

    def _start(self, args: Any, shell: bool, stdin: Any, stdout: Any, stderr: Any, bufsize: int,
               **kwargs: Any) -> None:
        self._proc = kwargs["started"]


def _discard_unwanted(job: Future[subprocess.Popen[bytes]]) -> None:
    """A process started for a caller that was cancelled meanwhile (in the starter's thread)."""
    if not job.cancelled() and job.exception() is None:
        _discard(job.result())


def _discard(process: subprocess.Popen[bytes]) -> None:
    """Kill `process` (with its group when it leads one), close its pipes, and reap it."""
    _kill(process)
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
    process.wait()


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(process.pid) == process.pid:  # a session of its own: what it started goes too
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()


def watch_exit(loop: asyncio.AbstractEventLoop, pid: int, callback: Callable[[int, int], object]) -> None:
    """`callback(pid, exit code)` on `loop` once child `pid` has exited and been reaped: when its pidfd
    becomes readable, or (no pidfd: an old kernel, a seccomp filter) from a thread that waits for it."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        threading.Thread(target=lambda: loop.call_soon_threadsafe(callback, pid, _reaped(pid)),
                         name=f"wait-{pid}", daemon=True).start()
        return

    def reap() -> None:
        loop.remove_reader(pidfd)
        try:
            code = _reaped(pid)
        finally:
            os.close(pidfd)
        callback(pid, code)
    loop.add_reader(pidfd, reap)


def _reaped(pid: int) -> int:
    """Child `pid`'s exit code, once it has exited (it is waited for)."""
    try:
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    except ChildProcessError:  # reaped elsewhere: asyncio's own watchers report 255 too
        logger.warning("child process %d: its exit status was already read", pid)
        return 255


if sys.version_info < (3, 12):  # (3.12 deprecates child watchers, and watches pidfds itself)
    class _PidfdWatcher(asyncio.AbstractChildWatcher):
        """Each child's pidfd becomes readable when it exits: the running loop reaps it then."""

        def add_child_handler(self, pid: int, callback: Callable[[int, int, Unpack[_Ts]], object],
                              *args: *_Ts) -> None:
            watch_exit(asyncio.get_running_loop(), pid, lambda pid, code: callback(pid, code, *args))

        def remove_child_handler(self, pid: int) -> bool:
            return True

        def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
            pass

        def close(self) -> None:
            pass

        def is_active(self) -> bool:
            return True

        def __enter__(self) -> _PidfdWatcher:
            return self

        def __exit__(self, *exc: object) -> None:
            pass


def watch_children_by_pidfd() -> None:
    """On Python 3.11 with pidfds (Linux 5.3+), watch subprocesses without a thread each; else leave
    asyncio's default. Idempotent."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # an old kernel or a seccomp filter: keep the threaded watcher
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if not isinstance(asyncio.get_child_watcher(), _PidfdWatcher):
            asyncio.set_child_watcher(_PidfdWatcher())
