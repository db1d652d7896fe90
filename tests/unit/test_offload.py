"""Heavy pure work in worker processes (server/offload.py): what counts as large, and where it runs."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from server import offload
from server.api.middleware import WorldWork

Handed = tuple[threading.Thread, tuple[Any, ...]]  # the thread that handed work over, and what it handed


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Handed]]:
    """What is handed to two workers (started anew), each hand-over as it happens."""
    offload.shutdown()
    monkeypatch.setattr(offload, "WORKERS", 2)
    calls: list[Handed] = []
    submit = ProcessPoolExecutor.submit

    def recorded(self: ProcessPoolExecutor, *args: Any, **kwargs: Any) -> Any:
        calls.append((threading.current_thread(), args))
        return submit(self, *args, **kwargs)
    monkeypatch.setattr(ProcessPoolExecutor, "submit", recorded)
    try:
        yield calls
    finally:
        offload.shutdown()


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


async def test_work_is_handed_to_the_workers_off_the_loop(handed: list[Handed]) -> None:
    """A hand-over may spawn a worker process: on the loop, that held every world about 70 ms."""
    assert await offload.run(partial(sorted, [2, 1])) == [1, 2]
    assert handed and threading.main_thread() not in [thread for thread, _ in handed]


def _held_until(flag: str) -> int:
    """Work that holds its worker until `flag` exists (a minute at most: a failed test leaves no worker
    that would keep the tests from ending); its process id."""
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.005)
    return os.getpid()


async def _for(world: str, work: Any, *, light: bool = True) -> Any:
    offload.working_for(world)
    return await offload.run(work, light=light)


async def test_one_world_works_in_one_worker_at_a_time_and_leaves_the_other_to_other_worlds(
        tmp_path: Path, handed: list[Handed]) -> None:
    """A world streaming a fast reply sends its pages' blocks (light work, up to 64 KiB each) to the workers
    beside its heavy work: it kept both busy, and another world's page fragment waited 93-98 ms at its p50
    (bench/worker_share.py)."""
    go = str(tmp_path / "go")
    try:
        holding = asyncio.create_task(_for("A", partial(_held_until, go)))
        more_of_a = asyncio.create_task(_for("A", partial(os.getpid)))
        # World B's work runs at once, in the other worker, while A's second is not even handed over.
        assert await asyncio.wait_for(_for("B", partial(os.getpid)), timeout=60) != os.getpid()
        assert len(handed) == 2 and not holding.done() and not more_of_a.done()
    finally:
        Path(go).touch()
    await asyncio.wait_for(asyncio.gather(holding, more_of_a), timeout=60)
    assert len(handed) == 3


async def test_a_world_waiting_for_the_heavy_slot_keeps_its_light_work_going(tmp_path: Path,
                                                                             handed: list[Handed]) -> None:
    """Found by review: a world's heavy work took the world's room, then queued for the heavy slot that
    another world held, and the world's light work waited for that other world, a worker free."""
    go = str(tmp_path / "go")
    try:
        holding = asyncio.create_task(_for("B", partial(_held_until, go), light=False))
        queued = asyncio.create_task(_for("A", partial(os.getpid), light=False))
        assert await asyncio.wait_for(_for("A", partial(os.getpid)), timeout=60) != os.getpid()
        assert len(handed) == 2 and not holding.done() and not queued.done()
    finally:
        Path(go).touch()
    await asyncio.wait_for(asyncio.gather(holding, queued), timeout=60)


async def test_a_request_or_socket_under_a_world_s_path_does_that_world_s_work() -> None:
    seen: dict[str, str | None] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen[scope["path"]] = offload._world.get()

    async def nothing(*_: Any) -> Any:
        return {}

    paths = ["/api/worlds/w_1/approvals", "/w/w_2/ws", "/w/w_3", "/api/worlds", "/static/app.js"]
    for kind, path in zip(["http", "websocket", "http", "http", "http"], paths, strict=True):
        # (each in a task of its own, as the server runs each request and socket)
        await asyncio.create_task(WorldWork(app)({"type": kind, "path": path}, nothing, nothing))
    assert seen == {"/api/worlds/w_1/approvals": "w_1", "/w/w_2/ws": "w_2", "/w/w_3": "w_3",
                    "/api/worlds": None, "/static/app.js": None}
