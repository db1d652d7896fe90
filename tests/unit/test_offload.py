"""Heavy pure work in worker processes (server/offload.py): what counts as large, and where it runs."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

import pytest

from server import offload


def test_an_event_is_large_by_its_content_or_by_its_tool_calls_arguments() -> None:
    big = "x" * (offload.HEAVY + 1)
    assert offload.is_large({"kind": "message", "content": big})
    # A 2 MB `file_write` is a reply with no content (found by review: it was redacted on the loop).
    assert offload.is_large({"kind": "message", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "file_write", "arguments": big}}]})
    assert not offload.is_large({"kind": "message", "content": "hi", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "file_read", "arguments": "{}"}}]})
    assert not offload.is_large({"kind": "notice", "text": big})  # only what is redacted and rendered at length


async def test_work_runs_in_another_process_and_its_answer_comes_back() -> None:
    try:
        assert await offload.run(partial(os.getpid)) != os.getpid()
        assert await offload.run(partial(sorted, [3, 1, 2])) == [1, 2, 3]
    finally:
        offload.shutdown()


async def test_work_is_handed_to_the_workers_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hand-over may spawn a worker process: on the loop, that held every world about 70 ms."""
    threads: list[threading.Thread] = []
    submit = ProcessPoolExecutor.submit

    def recorded(self: ProcessPoolExecutor, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        return submit(self, *args, **kwargs)
    monkeypatch.setattr(ProcessPoolExecutor, "submit", recorded)
    try:
        assert await offload.run(partial(sorted, [2, 1])) == [1, 2]
    finally:
        offload.shutdown()
    assert threads and threading.main_thread() not in threads


def _files() -> list[str]:
    folder = offload._folder
    return sorted(p.name for p in folder.iterdir()) if folder is not None else []


def _fail(message: str) -> None:
    raise ValueError(message)


async def test_a_large_answer_comes_back_whole_and_leaves_no_file_behind() -> None:
    """The work and its answer travel in files (pickled to a pipe in one call, a 16 MiB result held the GIL
    13-38 ms while every world waited): each run removes its own, whether the work answered or raised."""
    text = "lorem ipsum é€ \U0001f600 " * 700_000  # 16 MB, not only ASCII
    try:
        assert await offload.run(partial(str.upper, text)) == text.upper()
        assert await offload.run(partial(bytes, 3)) == b"\0\0\0"
        with pytest.raises(ValueError, match="refused"):
            await offload.run(partial(_fail, "refused"))
        assert _files() == []
    finally:
        offload.shutdown()


async def test_work_given_up_leaves_no_file_behind() -> None:
    try:
        await offload.run(partial(os.getpid))  # a worker is up
        run = asyncio.ensure_future(offload.run(partial(time.sleep, 0.5)))
        await asyncio.sleep(0.2)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await offload.run(partial(time.sleep, 0.5), light=True)  # the given-up work has finished meanwhile
        assert _files() == []
    finally:
        offload.shutdown()


async def test_the_files_folder_is_private_and_a_killed_servers_folder_is_removed() -> None:
    dead = _ended_process_id()
    try:
        await offload.run(partial(os.getpid))
        folder = offload._folder
        assert folder is not None and folder.stat().st_mode & 0o777 == 0o700
        stale = folder.parent / f"agent-world-offload-{dead}-abc"
        stale.mkdir()
        (stale / "x.work").write_bytes(b"secret")
        offload.shutdown()
        assert not folder.exists()
        await offload.run(partial(os.getpid))
        assert not stale.exists()
    finally:
        offload.shutdown()


def _ended_process_id() -> int:
    """The id of a process that has ended (and been waited for)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid
