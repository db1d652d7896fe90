"""Heavy pure work on large inputs, in worker processes.

A thread does not free the event loop from CPU-bound Python: CPython's `re`, markdown-it and Pygments
run holding the GIL, which the loop needs for each step of every other request. Redacting a 16 MiB
tool result in a thread held it for about 2 s (bench/isolation.py), and every world waited. Work given
to `run` goes to a small pool of worker processes, each with a GIL of its own, started on first use.
What goes in and out is pickled, so only pure functions of picklable arguments belong here (module
functions, or `functools.partial` of them), on inputs large enough to pay for the copy (`HEAVY`).
A pool that broke (a worker killed) is started anew; the work it lost runs in a thread.

The work and its answer travel in files of a private folder (in memory, /dev/shm, where it has room), not
through the pool's pipes. The pool pickles into memory in one C call that holds the GIL: 13-38 ms for a
16 MiB result or its 33 MB line, while the loop, and every world, waited (bench/isolation.py). Pickled to
a file, a large payload goes to the kernel in `write` calls that release the GIL, and comes back in one
`read` that does too; only making a `str` of it holds the GIL, for one copy (into memory the allocator
reuses: runtime.tune_allocator).

Light work (a page's few kilobytes of Markdown, which must not hold the loop either) is never left
waiting behind another world's heavy work: heavy work takes at most all workers but one.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing
import os
import pickle
import shutil
import tempfile
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

from .runtime import tune_allocator

T = TypeVar("T")
logger = logging.getLogger(__name__)

HEAVY = 64 * 1024  # characters: below this a piece of work costs less than its trip to a worker
# JSON in C (orjson) runs at about 1 GB/s: below this, encoding or decoding costs the loop about a
# millisecond, less than a trip to a worker (which a busy machine's nice workers can make 50 ms long).
HEAVY_JSON = 1024 * 1024
WORKERS = max(1, min(2, os.cpu_count() or 1))
_pool: ProcessPoolExecutor | None = None
_folder: Path | None = None  # the pool's files (see the module's docstring)
_FOLDER_PREFIX = "agent-world-offload-"
_ROOM = 1 << 30  # bytes free a memory folder needs for the files: several trips of a 16 MiB result at once
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


def _executor() -> tuple[ProcessPoolExecutor, Path]:
    global _pool, _folder
    if _pool is None:
        # spawn: the server has threads (SQLite, the executor's), which a forked child would inherit locked.
        _pool = ProcessPoolExecutor(max_workers=WORKERS,
                                    mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker)
    if _folder is None:
        _folder = _make_folder()
        atexit.register(shutil.rmtree, _folder, ignore_errors=True)  # (a process that never calls shutdown)
    return _pool, _folder


def _make_folder() -> Path:
    """A folder only this user can enter, in memory where the system has room there (a container's
    /dev/shm is 64 MiB by default: too small for a large result's trips); with the folders of servers
    that were killed before they could remove theirs (named by process id) removed."""
    shm = Path("/dev/shm")
    parent = shm if _roomy(shm) else Path(tempfile.gettempdir())
    for stale in parent.glob(f"{_FOLDER_PREFIX}*-*"):
        pid = stale.name[len(_FOLDER_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-", dir=parent))


def _roomy(folder: Path) -> bool:
    try:
        room = os.statvfs(folder)
    except OSError:  # none
        return False
    return os.access(folder, os.W_OK | os.X_OK) and room.f_bavail * room.f_frsize >= _ROOM


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


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
    pool, folder = _executor()
    fd, work_file = tempfile.mkstemp(dir=folder, suffix=".work")
    os.close(fd)
    answer_file = work_file[:-len(".work")] + ".answer"
    try:
        # In a thread: the pickling, and the submit, which may spawn a worker (the first ones, or after a
        # break): that held the loop about 70 ms on a loaded machine.
        future = await asyncio.to_thread(_hand_over, pool, work, work_file, answer_file)
        await asyncio.wrap_future(future)
        return cast(T, await asyncio.to_thread(_load, answer_file))
    except BrokenProcessPool as broken:
        logger.warning("the worker pool broke (%s): it starts anew, and this work runs in a thread", broken)
        if _pool is pool:
            _pool = None
        return await asyncio.to_thread(work)
    finally:  # (what a failed or given-up run left)
        for path in (work_file, answer_file):
            Path(path).unlink(missing_ok=True)


def _hand_over(pool: ProcessPoolExecutor, work: Callable[[], Any], work_file: str, answer_file: str) -> Future[None]:
    with open(work_file, "wb", buffering=0) as file:
        pickle.dump(work, _Whole(file), protocol=pickle.HIGHEST_PROTOCOL)
    # The answer's file exists before the worker writes it: if this run was given up (and its files
    # removed), the worker finds nothing to write into and leaves nothing behind.
    Path(answer_file).touch(mode=0o600, exist_ok=False)
    return pool.submit(partial(_carry, work_file, answer_file))


def _carry(work_file: str, answer_file: str) -> None:
    """In a worker: the work from its file, and its answer into the other. Each file is removed by its
    reader (freeing 40 MB of a memory folder took the loop 16 ms), or by the run at its end if it failed."""
    with open(work_file, "rb", buffering=0) as file:
        work: Callable[[], Any] = pickle.load(file)
    os.unlink(work_file)
    answer = work()
    with open(os.open(answer_file, os.O_WRONLY), "wb", buffering=0) as file:
        pickle.dump(answer, _Whole(file), protocol=pickle.HIGHEST_PROTOCOL)


def _load(answer_file: str) -> Any:
    with open(answer_file, "rb", buffering=0) as file:
        answer = pickle.load(file)
    os.unlink(answer_file)
    return answer


class _Whole:
    """A file's `write` that writes all it is given (a raw file may write part, and pickle would not retry)."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += self._file.write(view[done:])
        return done


def shutdown() -> None:
    """Stop the workers (at the server's stop); a later `run` starts new ones."""
    global _pool, _folder
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
        _folder = None
