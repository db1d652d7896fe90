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
waiting behind another world's heavy work: heavy work takes at most all workers but one.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
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
# Per event loop (the tests run several): how many heavy runs may use the workers at once.
_heavy_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


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


async def run(work: Callable[[], T], *, light: bool = False) -> T:
    """`work()` in a worker process; in a thread if the pool broke under it. `light`: small work that a
    person waits for (it may use the worker that heavy work leaves free)."""
    if light:
        return await _run(work)
    loop = asyncio.get_running_loop()
    slots = _heavy_slots.get(loop)
    if slots is None:
        slots = _heavy_slots[loop] = asyncio.Semaphore(max(1, WORKERS - 1))
    async with slots:
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
