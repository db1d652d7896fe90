"""Small asyncio helpers the whole server shares."""
from __future__ import annotations

import asyncio
import importlib
import logging
import time
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


class Slices:
    """Cooperative time slices for a task that works through a run of small steps: `step` yields to the
    loop once the task has held it `budget` seconds. A page's writer rendering a burst of frames, or the
    LLM stream parsing the chunks it read at once, held the loop 20-60 ms at a time, and every other
    world's requests waited behind it (bench/isolation.py, asyncio's slow-callback log)."""

    def __init__(self, budget: float = 0.004) -> None:
        self.budget = budget
        self._since = time.perf_counter()

    async def step(self) -> None:
        if time.perf_counter() - self._since >= self.budget:
            await asyncio.sleep(0)  # whatever is ready meanwhile runs now, then this task goes on
            self._since = time.perf_counter()

    def begin(self) -> None:
        """The task comes back from a real wait: its slice starts now."""
        self._since = time.perf_counter()


async def import_in_thread(name: str) -> ModuleType:
    """Import `name` in a worker thread: the MCP and OpenAI SDKs take 1.5-2 s of CPU to import, and are
    imported when first used (not at startup), so the event loop must go on serving meanwhile."""
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
