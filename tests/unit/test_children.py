"""The pidfd child watcher (server/tools/sandbox/children.py): exit codes arrive, in any loop, with no thread
per process."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from server.tools.sandbox import children
from server.tools.sandbox.children import watch_children_by_pidfd
from server.tools.sandbox.output import start_process
from tests.fixtures.eventually import eventually_async


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
    assert isinstance(asyncio.get_child_watcher(), children._PidfdWatcher)
    threads = threading.active_count()
    for _ in range(2):  # each asyncio.run is a new loop: the watcher is tied to none
        assert asyncio.run(_codes()) == [0, 3, 0, 7]
    assert threading.active_count() == threads


def _slow_popen(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[int]:
    """Every process takes `seconds` to start, as one may on a loaded machine (vfork, then the child's set-up);
    the pids of those started."""
    real, started = subprocess.Popen, []

    def slow(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        time.sleep(seconds)
        process = real(*args, **kwargs)
        started.append(process.pid)
        return process
    monkeypatch.setattr(subprocess, "Popen", slow)
    return started


async def test_a_tool_process_starts_while_the_event_loop_serves_everyone_else(monkeypatch: pytest.MonkeyPatch) -> None:
    # Started on the loop, each command of each world held every world's requests 8-15 ms under load.
    _slow_popen(monkeypatch, 0.3)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1
    ticker = asyncio.create_task(tick())
    proc = await start_process("/bin/sh", "-c", "echo started; exit 3", stdout=asyncio.subprocess.PIPE)
    ticker.cancel()
    assert ticks >= 10  # the loop turned all along
    assert proc.stdout is not None and await proc.stdout.read() == b"started\n"
    assert await proc.wait() == 3


def _exists(pid: int) -> bool:
    """Whether `pid` is still a process, a zombie included (not yet reaped)."""
    return Path(f"/proc/{pid}").exists()


async def test_a_process_started_for_a_caller_cancelled_meanwhile_is_killed_and_reaped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started = _slow_popen(monkeypatch, 0.3)
    starting = asyncio.create_task(start_process("/bin/sleep", "30", start_new_session=True))
    await asyncio.sleep(0.05)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await eventually_async(lambda: started, timeout=10, what="the process started after all")
    await eventually_async(lambda: not _exists(started[0]), timeout=10,
                           what="the unwanted process killed and reaped (no zombie left)")
