"""Heavy pure work on large inputs, in worker processes.

A thread does not free the event loop from CPU-bound Python: CPython's `re`, markdown-it and Pygments
run holding the GIL, which the loop needs for each step of every other request. Redacting a 16 MiB
tool result in a thread held it for about 2 s (bench/isolation.py), and every world waited. Work given
to `run` goes to a small pool of worker processes, each with a GIL of its own, started on first use.
What goes in and out is pickled, so only pure functions of picklable arguments belong here (module
functions, or `functools.partial` of them), on inputs large enough to pay for the copy (`HEAVY`).
A pool that broke (a worker killed) is started anew; the work it lost runs in a thread.

Light work (a page's few kilobytes of Markdown, which must not hold the loop either) is never left
waiting behind another world's heavy work: heavy work takes at most all workers but one.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)

HEAVY = 64 * 1024  # characters: below this a piece of work costs less than its trip to a worker
# JSON in C (orjson) runs at about 1 GB/s: below this, encoding or decoding costs the loop about a
# millisecond, less than a trip to a worker (which a busy machine's nice workers can make 50 ms long).
HEAVY_JSON = 1024 * 1024
WORKERS = max(1, min(2, os.cpu_count() or 1))
_pool: ProcessPoolExecutor | None = None
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
                                    mp_context=multiprocessing.get_context("spawn"), initializer=_lower_priority)
    return _pool


def _lower_priority() -> None:
    """Workers yield the CPU to the server's own process: on a busy machine one world's big result waits,
    not every world's requests."""
    os.nice(10)


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
    try:
        # Handed over from a thread: a submit may spawn a worker (the first ones, or after a break), which
        # held the loop about 70 ms on a loaded machine.
        return await asyncio.wrap_future(await asyncio.to_thread(pool.submit, work))
    except BrokenProcessPool as broken:
        logger.warning("the worker pool broke (%s): it starts anew, and this work runs in a thread", broken)
        if _pool is pool:
            _pool = None
        return await asyncio.to_thread(work)


def shutdown() -> None:
    """Stop the workers (at the server's stop); a later `run` starts new ones."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None
