"""The small asyncio helpers every part shares: single flights and cooperative time slices."""
from __future__ import annotations

import asyncio
import gc
import sys
import time
import weakref
from collections.abc import Awaitable, Callable

import pytest

from server.aio import SingleFlight, Slices, import_in_thread, next_turn


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _ticks_during(burst: object) -> int:
    """How often another task ran while `burst` (a coroutine) held the loop with its small steps."""
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            await asyncio.sleep(0)
            ticks += 1

    other = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    ticks = 0
    await burst  # type: ignore[misc]
    done = True
    await other
    return ticks


async def test_a_burst_of_small_steps_lets_other_tasks_run_between_its_slices() -> None:
    async def burst(slices: Slices | None) -> None:
        for _ in range(60):
            _busy(0.001)  # one frame's rendering
            if slices is not None:
                await slices.step()

    assert await _ticks_during(burst(None)) <= 1  # held the loop the whole 60 ms
    assert await _ticks_during(burst(Slices(budget=0.004))) >= 5  # about one slice in four steps


async def _turns_taken(jobs: Callable[[list[str]], list[Awaitable[None]]]) -> list[set[str]]:
    """Who did work in each turn of the loop while `jobs` ran (each appends its name to the list it is
    given as it works), told apart by another task that marks every turn."""
    seen: list[str] = []
    done = False

    async def ticker() -> None:
        while not done:
            seen.append("tick")
            await asyncio.sleep(0)

    other = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await asyncio.gather(*jobs(seen))
    done = True
    await other
    turns: list[set[str]] = [set()]
    for entry in seen:
        if entry == "tick":
            turns.append(set())
        else:
            turns[-1].add(entry)
    return [turn for turn in turns if turn]


async def test_tasks_that_used_up_their_slice_go_on_one_per_turn_of_the_loop() -> None:
    # Five page writers with a burst each: a request needing a few turns of the loop must not wait for
    # five slices in every one of them.
    async def burst(name: str, seen: list[str]) -> None:
        slices = Slices(budget=0.004)
        for _ in range(16):
            _busy(0.001)
            seen.append(name)
            await slices.step()

    busy = await _turns_taken(lambda seen: [burst(f"burst {n}", seen) for n in range(5)])
    assert len(busy) >= 15  # 80 ms of work in slices of about 4 ms
    assert len(busy[0]) == 5  # each burst's first slice, before any used up its own
    assert all(len(turn) == 1 for turn in busy[1:]), busy


async def test_a_waiting_slice_that_is_cancelled_leaves_the_turns_to_the_others() -> None:
    slices = Slices(budget=0.0)
    stuck = asyncio.create_task(slices.step())
    await asyncio.sleep(0)
    stuck.cancel()
    other = Slices(budget=0.0)
    await asyncio.wait_for(other.step(), timeout=5)  # its turn comes
    assert stuck.cancelled()


async def test_tasks_that_ask_for_a_turn_at_once_go_on_in_turns_of_their_own() -> None:
    # Five pages woken by the same finished reply write its 4 MB frame: one a turn, not five in one.
    async def page(name: str, seen: list[str]) -> None:
        await next_turn()
        seen.append(name)

    busy = await _turns_taken(lambda seen: [page(f"page {n}", seen) for n in range(5)])
    assert len(busy) == 5 and all(len(turn) == 1 for turn in busy), busy


def test_a_finished_event_loop_is_not_kept_alive_by_the_slices_it_ran() -> None:
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one_slice() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await Slices(budget=0.0).step()

    asyncio.run(one_slice())
    gc.collect()
    assert loops[0]() is None


async def test_concurrent_askers_share_one_run_and_a_cancelled_asker_leaves_it_to_the_next() -> None:
    flights: SingleFlight[str] = SingleFlight()
    runs: list[str] = []
    release = asyncio.Event()

    async def work(name: str) -> str:
        runs.append(name)
        await release.wait()
        return name

    first = asyncio.create_task(flights.run("k", lambda: work("first")))
    others = [asyncio.create_task(flights.run("k", lambda: work("other"))) for _ in range(3)]
    await asyncio.sleep(0)
    release.set()
    assert await first == "first" and await asyncio.gather(*others) == ["first"] * 3
    assert runs == ["first"]

    release.clear()
    cancelled = asyncio.create_task(flights.run("k", lambda: work("cancelled")))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(flights.run("k", lambda: work("next")))
    await asyncio.sleep(0)
    cancelled.cancel()
    release.set()
    assert await waiting == "next"  # run anew, not a cancellation it never asked for
    with pytest.raises(asyncio.CancelledError):
        await cancelled


async def test_a_module_is_imported_in_a_thread_once_and_then_found_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[object] = []
    real = asyncio.to_thread

    async def to_thread(fn: Callable[..., object], /, *args: object) -> object:
        threads.append(args)
        return await real(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    first = await import_in_thread("colorsys")
    assert threads == [("colorsys",)] and first.__name__ == "colorsys"
    assert await import_in_thread("colorsys") is first
    assert threads == [("colorsys",)]  # imported: no thread
