"""Heavy pure work in worker processes (server/offload.py): what counts as large, and where it runs."""
from __future__ import annotations

import os
import threading
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

