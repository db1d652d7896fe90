"""How the event loop learns that a tool's process exited: through a pidfd, not a thread per process.

Python 3.11's default child watcher starts a thread for every subprocess and waits for it to run
before `create_subprocess_exec` returns: 2-8 ms on a loaded machine, on the path from an approval
to the tool's result. Python 3.12 watches pidfds on its own; on 3.11 this installs the same watcher
(its `PidfdChildWatcher` is tied to one loop, so it is written here for whichever loop is running).
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVarTuple, Unpack

logger = logging.getLogger(__name__)
_Ts = TypeVarTuple("_Ts")


class _PidfdWatcher(asyncio.AbstractChildWatcher):
    """Each child's pidfd becomes readable when it exits: the running loop reaps it then."""

    def add_child_handler(self, pid: int, callback: Callable[[int, int, Unpack[_Ts]], object],
                          *args: *_Ts) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop.add_reader(pidfd, self._reap, loop, pid, pidfd, callback, args)

    @staticmethod
    def _reap(loop: asyncio.AbstractEventLoop, pid: int, pidfd: int, callback: Callable[..., object],
              args: tuple[Any, ...]) -> None:
        loop.remove_reader(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere: asyncio's own watchers report 255 too
            logger.warning("child process %d: its exit status was already read", pid)
            code = 255
        finally:
            os.close(pidfd)
        callback(pid, code, *args)

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
