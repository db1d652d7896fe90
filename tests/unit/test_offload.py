"""Heavy pure work in worker processes (server/offload.py): what counts as large, and where it runs."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from server import offload
from server.tools.sandbox.bubblewrap import SHELL_LIMITS
from tests.fixtures.eventually import eventually_async


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


def _niceness() -> int:
    return os.nice(0)


def _held(gate: str, started: str) -> str:
    """Hold a worker until `gate` exists (opened by the test, not by a clock), or the test's process is gone."""
    Path(started).touch()
    parent = os.getppid()
    while not os.path.exists(gate) and os.getppid() == parent:
        time.sleep(0.005)
    return gate


async def test_heavy_work_runs_below_the_tools_priority_and_light_work_at_theirs() -> None:
    """Rendering one world's 16 MiB result at the tool processes' priority made another world's `true`
    take 3-17 ms (bench/isolation.py): heavy work yields to tools, light work (a page waits) does not."""
    server = _niceness()
    try:
        heavy = await offload.run(partial(_niceness))
        light = await offload.run(partial(_niceness), light=True)
    finally:
        offload.shutdown()
    tools = min(19, server + SHELL_LIMITS.niceness)
    assert light == tools
    assert heavy == min(19, server + offload.HEAVY_NICENESS)
    assert heavy > tools or tools == 19


async def test_light_work_is_not_left_behind_heavy_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offload, "LIGHT_WORKERS", 1)
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        heavy = [asyncio.create_task(offload.run(partial(_held, str(gate), str(started))))
                 for _ in range(offload.HEAVY_WORKERS + 1)]  # every heavy worker held, and more waiting
        await eventually_async(started.exists, timeout=60, what="a heavy run under way")
        assert await asyncio.wait_for(offload.run(partial(sorted, [2, 1]), light=True), 60) == [1, 2]
        assert not any(task.done() for task in heavy)
        gate.touch()
        assert await asyncio.gather(*heavy) == [str(gate)] * len(heavy)
    finally:
        gate.touch()
        offload.shutdown()
