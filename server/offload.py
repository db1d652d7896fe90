"""Heavy pure work on large inputs, in worker processes.

A thread does not free the event loop from CPU-bound Python: CPython's `re`, markdown-it and Pygments
run holding the GIL, which the loop needs for each step of every other request. Redacting a 16 MiB
tool result in a thread held it for about 2 s (bench/isolation.py), and every world waited. Work given
to `run` goes to worker processes, each with a GIL of its own, started on first use.
What goes in and out is pickled, so only pure functions of picklable arguments belong here (module
functions, or `functools.partial` of them), on inputs large enough to pay for the copy (`HEAVY`).
A pool that broke (a worker killed) is started anew; the work it lost runs in a thread.

Work and answers travel in files in memory, not through the pool's pipes (server/trip_files.py): a
large payload then crosses without holding the GIL the loop needs.

Light work (a page's few kilobytes of Markdown, which must not hold the loop either) is never left
waiting behind another world's heavy work: each has a pool of its own. Heavy work, one world's large
reply or result, runs at the lowest priority, below the server's loop and the tool processes; light work
at the tools' (nice +10). At the tools' priority, rendering a 16 MiB result made another world's
one-millisecond `true` take 3-17 ms. (Where the kernel groups processes by session, autogroup, a tool
in its sandbox's session shares the CPU with the server's group, whatever their nice values.)
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
# Heavy work, one run at a time (on two CPUs the other is left to the loop); light work, one run a CPU (at
# most two), its workers started as needed. Nice values, added to the server's: light work's as the tool
# processes' (tools/sandbox/bubblewrap.py: Limits); heavy work's the lowest there is.
HEAVY_WORKERS = 1
LIGHT_WORKERS = max(1, min(2, os.cpu_count() or 1))
LIGHT_NICENESS = 10
HEAVY_NICENESS = 19
_pools: dict[bool, ProcessPoolExecutor] = {}  # by `light`
_folder = trip_files.Folder()  # what carries work and answers (server/trip_files.py)
atexit.register(_folder.remove)  # (a process that never calls shutdown)
_warned = False  # that a trip failed, and work went by the pipes
# Per event loop (the tests run several): how many heavy runs may be handed over at once (their files in
# memory: the rest wait here, not in the pool's queue).
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


def _executor(light: bool) -> ProcessPoolExecutor:
    pool = _pools.get(light)
    if pool is None:
        # spawn: the server has threads (SQLite, the executor's), which a forked child would inherit locked.
        pool = _pools[light] = ProcessPoolExecutor(
            max_workers=LIGHT_WORKERS if light else HEAVY_WORKERS, mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker, initargs=(LIGHT_NICENESS if light else HEAVY_NICENESS,))
    return pool


def _start_worker(niceness: int) -> None:
    """Workers yield the CPU to the server's own process: on a busy machine one world's big result waits,
    not every world's requests. Their large objects reuse memory as the server's do (runtime.tune_allocator:
    fewer page faults, less of the machine's CPU)."""
    os.nice(niceness)
    tune_allocator()


async def run(work: Callable[[], T], *, light: bool = False) -> T:
    """`work()` in a worker process; in a thread if the pool broke under it. `light`: small work that a
    person waits for (its own worker, at the tools' priority, never behind heavy work)."""
    if light:
        return await _run(work, light=True)
    loop = asyncio.get_running_loop()
    slots = _heavy_slots.get(loop)
    if slots is None:
        slots = _heavy_slots[loop] = asyncio.Semaphore(HEAVY_WORKERS)
    async with slots:
        return await _run(work, light=False)


async def _run(work: Callable[[], T], light: bool) -> T:
    pool = _executor(light)
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
        if _pools.get(light) is pool:
            del _pools[light]
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
    while _pools:
        _pools.popitem()[1].shutdown(wait=False, cancel_futures=True)
    _folder.remove()
