"""Heavy pure work in worker processes (server/offload.py): what counts as large, and where it runs."""
from __future__ import annotations

import os
from functools import partial

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
