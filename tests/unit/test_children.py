"""The pidfd child watcher (server/tools/sandbox/children.py): exit codes arrive, in any loop, with no thread
per process."""
from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from server.tools.sandbox.children import _PidfdWatcher, watch_children_by_pidfd


async def _codes() -> list[int | None]:
    async def run(code: int) -> int | None:
        proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", f"exit {code}")
        await proc.wait()
        return proc.returncode
    return list(await asyncio.gather(*(run(code) for code in (0, 3, 0, 7))))


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 watches pidfds itself")
def test_exit_codes_arrive_in_successive_loops_without_a_thread_per_process() -> None:
    watch_children_by_pidfd()
    watch_children_by_pidfd()  # idempotent
    assert isinstance(asyncio.get_child_watcher(), _PidfdWatcher)
    threads = threading.active_count()
    for _ in range(2):  # each asyncio.run is a new loop: the watcher is tied to none
        assert asyncio.run(_codes()) == [0, 3, 0, 7]
    assert threading.active_count() == threads
