"""Heavy pure work on large inputs, in worker processes.

A thread does not free the event loop from CPU-bound Python: CPython's `re`, markdown-it and Pygments
run holding the GIL, which the loop needs for each step of every other request. Redacting a 16 MiB
tool result in a thread held it for about 2 s (bench/isolation.py), and every world waited. Work given
to `run` goes to a small pool of worker processes, each with a GIL of its own, started on first use.
What goes in and out is pickled, so only pure functions of picklable arguments belong here (module
functions, or `functools.partial` of them), on inputs large enough to pay for the copy (`HEAVY`).
A pool that broke (a worker killed) is started anew; the work it lost runs in a thread.

Work and answers travel in files in memory, not through the pool's pipes (server/trip_files.py): a
large payload then crosses without holding the GIL the loop needs.

Light work (a page's few kilobytes of Markdown, which must not hold the loop either) is never left
waiting behind another world's heavy work: heavy work takes at most all workers but one. Nor behind
another world's light work: one world's work, whatever its size, also takes at most all workers but one
(`working_for` says whose work it is). A world streaming a fast reply to its pages sends them block after
block of light work, up to 64 KiB each (100 ms of Markdown), beside its heavy work: it kept both workers,
so both cores of a two-core machine, busy, and another world's page waited behind it.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import multiprocessing
import os
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextvars import ContextVar
from typing import TypeVar, cast

from . import trip_files
from .runtime import tune_allocator

T = TypeVar("T")
logger = logging.getLogger(__name__)

HEAVY = 64 * 1024  # characters: below this a piece of work costs less than its trip to a worker
# JSON in C (orjson) runs at about 1 GB/s: below this, encoding or decoding costs the loop about a
# millisecond, less than a trip to a worker (which a busy machine's nice workers can make 50 ms long).
HEAVY_JSON = 1024 * 1024
WORKERS = max(1, min(2, os.cpu_count() or 1))
_pool: ProcessPoolExecutor | None = None
_folder = trip_files.Folder()  # what carries work and answers (server/trip_files.py)
atexit.register(_folder.remove)  # (a process that never calls shutdown)
_warned = False  # that a trip failed, and work went by the pipes
# Whose work a task's runs are: a world's id, set where that world's tasks begin (`working_for`).
_world: ContextVar[str | None] = ContextVar("offload_world", default=None)


def is_large(event: dict[str, object], heavy: int = HEAVY) -> bool:
    """Whether an event is worth a trip to a worker (its redaction, its rendering; with HEAVY_JSON, its
    JSON): its content, or its tool calls' arguments (a 2 MB `file_write` is a reply with no content), are
    over `heavy` characters."""
    return size(event) > heavy


def size(message: dict[str, object]) -> int:
    """Characters of a message's (or event's) text content and tool calls' arguments."""
    content = message.get("content")
    total = len(content) if isinstance(content, str) else 0
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        total += len(arguments) if isinstance(arguments, str) else 0
    return total


def _executor() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        # spawn: the server has threads (SQLite, the executor's), which a forked child would inherit locked.
        _pool = ProcessPoolExecutor(max_workers=WORKERS,
                                    mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker)
    return _pool


def _start_worker() -> None:
    """Workers yield the CPU to the server's own process: on a busy machine one world's big result waits,
    not every world's requests. Their large objects reuse memory as the server's do (runtime.tune_allocator:
    fewer page faults, less of the machine's CPU)."""
    os.nice(10)
    tune_allocator()


def working_for(world: str) -> None:
    """The work the current task (and the tasks it starts from now on) sends to the workers is `world`'s:
    it shares that world's room (`run`). Set where a world's tasks begin: its sockets, its API calls, its
    agents' turns and tool runs."""
    _world.set(world)


class _Slots:
    """One event loop's room in the workers (the tests run several loops): all but one of them for heavy
    work, and for each world's work."""

    def __init__(self) -> None:
        self.heavy = asyncio.Semaphore(max(1, WORKERS - 1))
        self._worlds: dict[str, tuple[asyncio.Semaphore, int]] = {}  # (its room, how many hold or want it)

    @contextlib.asynccontextmanager
    async def world(self, world: str | None) -> AsyncIterator[None]:
        if world is None:  # (work no world asked for: the server's own)
            yield
            return
        room, users = self._worlds.get(world) or (asyncio.Semaphore(max(1, WORKERS - 1)), 0)
        self._worlds[world] = (room, users + 1)
        try:
            async with room:
                yield
        finally:
            room, users = self._worlds[world]
            if users == 1:
                del self._worlds[world]  # (100,000 worlds each keep nothing here once their work is done)
            else:
                self._worlds[world] = (room, users - 1)


_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slots] = weakref.WeakKeyDictionary()


async def run(work: Callable[[], T], *, light: bool = False) -> T:
    """`work()` in a worker process; in a thread if the pool broke under it. `light`: small work that a
    person waits for (it may use the worker that heavy work leaves free). Within the room of the world
    whose work it is (`working_for`): its other work waits for it, other worlds' does not."""
    loop = asyncio.get_running_loop()
    slots = _slots.get(loop)
    if slots is None:
        slots = _slots[loop] = _Slots()
    if light:
        async with slots.world(_world.get()):
            return await _run(work)
    # The heavy slot first: a world that held its room while it queued for the slot would keep its own
    # light work from the free worker for as long as another world's heavy work runs.
    async with slots.heavy, slots.world(_world.get()):
        return await _run(work)


async def _run(work: Callable[[], T]) -> T:
    global _pool
    pool = _executor()
    trip = trip_files.Trip(_folder)
    try:
        try:
            # In a thread: the pickling, and the submit, which may spawn a worker (the first ones, or after
            # a break): that held the loop about 70 ms on a loaded machine.
            handed = await asyncio.to_thread(trip.hand_over, pool, work)
            assert handed is not None, "only a run given up (cancelled: not here) hands nothing over"
            future, by_pipe = handed
            delivered = await asyncio.wrap_future(future)
            return cast(T, delivered if by_pipe else await asyncio.to_thread(trip.answer, delivered))
        except trip_files.TripError as failed:  # (not done; or done, and its answer lost: done again)
            _warn_once(failed)
            return cast(T, await asyncio.wrap_future(await asyncio.to_thread(pool.submit, work)))
    except BrokenProcessPool as broken:
        logger.warning("the worker pool broke (%s): it starts anew, and this work runs in a thread", broken)
        if _pool is pool:
            _pool = None
        return await asyncio.to_thread(work)
    finally:
        if files := trip.give_up():  # what a failed or given-up run left: removed off the loop
            asyncio.get_running_loop().run_in_executor(None, trip_files.remove, files)


def _warn_once(failed: Exception) -> None:
    global _warned
    if not _warned:
        logger.warning("%s: the work goes by the pipes (said once)", failed)
        _warned = True


def shutdown() -> None:
    """Stop the workers (at the server's stop); a later `run` starts new ones."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None
    _folder.remove()
