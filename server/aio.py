"""Small asyncio helpers the whole server shares."""
from __future__ import annotations

import asyncio
import collections
import importlib
import logging
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from types import ModuleType
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


def keep(tasks: set[asyncio.Task[Any]], job: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """Run `job` as a task held in `tasks` until it ends (the loop keeps only weak references to tasks)."""
    task = asyncio.create_task(job, name=name)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


async def cancel_and_wait(task: asyncio.Task[object] | None, attempts: int = 5) -> None:
    """Cancel `task` and wait for it to end, a bounded while.

    Code that uses asyncio.wait_for inside (some libraries do) can swallow one cancellation on
    Python 3.11, so ask again rather than wait for ever.
    """
    for _ in range(attempts):
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    if task is not None and not task.done():
        logger.warning("task %s did not stop", task.get_name())


async def cancel_all(timers: dict[Any, asyncio.TimerHandle], tasks: set[asyncio.Task[Any]]) -> None:
    """Stop a part's armed timers and its tasks under way, and wait for those tasks to end."""
    for timer in timers.values():
        timer.cancel()
    timers.clear()
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Paced:
    """A background chore's pace: `step` pauses as long as the chore worked since the last step, so it
    takes at most half of the loop's time and requests that come meanwhile are served between its steps
    (hosting 1,000 worlds at full speed right after a start made other requests wait 20-90 ms)."""

    def __init__(self) -> None:
        self._since = time.perf_counter()

    async def step(self) -> None:
        await asyncio.sleep(time.perf_counter() - self._since)
        self._since = time.perf_counter()


class _Turns:
    """One event loop's tasks that used up a slice, let go on one per turn of the loop, in order. (It
    holds no reference to its loop, the key it is kept under: a finished loop's entry goes with it.)"""

    def __init__(self) -> None:
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._pumping = False

    def wait(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        turn = loop.create_future()
        self._waiting.append(turn)
        if not self._pumping:
            self._pumping = True
            loop.call_soon(self._pump, loop)
        return turn

    def _pump(self, loop: asyncio.AbstractEventLoop) -> None:
        # Runs once per turn of the loop (call_soon puts it behind what is ready now): the task let go
        # here runs in the next turn, beside everything else ready then, and alone of its kind.
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # (a cancelled waiter is skipped)
                turn.set_result(None)
                break
        if self._waiting:
            loop.call_soon(self._pump, loop)
        else:
            self._pumping = False


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = weakref.WeakKeyDictionary()


async def next_turn() -> None:
    """Go on in a turn of the event loop of its own, after whatever is ready now and after the tasks that
    asked before (one a turn): for a long step (a slice used up, a frame of megabytes to write) that many
    tasks would otherwise take in the same turn."""
    loop = asyncio.get_running_loop()
    turns = _turns.get(loop)
    if turns is None:
        turns = _turns[loop] = _Turns()
    await turns.wait(loop)


class Slices:
    """Cooperative time slices for a task that works through a run of small steps: `step` yields to the
    loop once the task has held it `budget` seconds. A page's writer rendering a burst of frames, or the
    LLM stream parsing the chunks it read at once, held the loop 20-60 ms at a time, and every other
    world's requests waited behind it (bench/isolation.py, asyncio's slow-callback log).

    The tasks that used up a slice go on one per turn of the loop, in turn: five busy page writers and an
    LLM stream each yielding after 4 ms still made every turn 24 ms long, and a request that takes a few
    turns (read, handle, answer) waited that many times. Now a turn goes on with at most one of those,
    beside the shorter steps of everything else; one after another, they get as much of the loop as before."""

    def __init__(self, budget: float = 0.004) -> None:
        self.budget = budget
        self._since = time.perf_counter()

    async def step(self) -> None:
        if time.perf_counter() - self._since >= self.budget:
            await next_turn()  # whatever is ready meanwhile runs now, then this task in its turn
            self._since = time.perf_counter()

    def begin(self) -> None:
        """The task comes back from a real wait: its slice starts now."""
        self._since = time.perf_counter()


async def import_in_thread(name: str) -> ModuleType:
    """Import `name` in a worker thread: the MCP and OpenAI SDKs take 1.5-2 s of CPU to import (aiohttp
    0.1 s), and are imported when first used (not at startup), so the event loop must go on serving
    meanwhile. Once imported, at once."""
    module = sys.modules.get(name)
    if module is not None and not getattr(module.__spec__, "_initializing", False):
        return module
    return await asyncio.to_thread(importlib.import_module, name)


class SingleFlight(Generic[T]):
    """Concurrent askers for the same key share one run of the work: five pages that want the same
    16 MiB result redacted, or the same blocks rendered, send it to a worker once, not five times."""

    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Future[T]] = {}

    async def run(self, key: Hashable, work: Callable[[], Awaitable[T]]) -> T:
        """`work()`'s value, or that of the run for `key` under way (its asker cancelled: this one runs it)."""
        while (running := self._running.get(key)) is not None:
            await asyncio.wait([running])
            if not running.cancelled():
                return running.result()
        future = self._running[key] = asyncio.get_running_loop().create_future()
        try:
            value = await work()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: the askers waiting for it raise it themselves
            raise
        except BaseException:  # (SystemExit and the like: the askers waiting must not wait for ever)
            future.cancel()
            raise
        finally:
            del self._running[key]
        future.set_result(value)
        return value
