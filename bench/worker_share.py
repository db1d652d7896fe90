"""How long another world's page waits for the worker processes while one world keeps them busy.

    python bench/worker_share.py [--seconds 15]

World B renders a 2 KB Markdown fragment in a worker (`offload.run(..., light=True)`, as a page does) every
50 ms: alone (the baseline, in the same run), then while world A renders 60 KB blocks back to back (light
work, as a fast reply's pages do) and 400 KB messages (heavy work, as its finished reply does), each in a
task of A's (`offload.working_for`). The real worker pool, on this machine's cores.
Target: B's p99 under A within 2x of its p99 alone.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_probe, summary_ms, table  # noqa: E402
from bench.isolation import markdown  # noqa: E402
from server import offload  # noqa: E402
from web.markdown import render_markdown  # noqa: E402


async def a_renders(text: str, light: bool, stop: asyncio.Event) -> None:
    offload.working_for("A")
    n = 0
    while not stop.is_set():
        await offload.run(partial(render_markdown, f"{text}{n}"), light=light)  # (a new text each time)
        n += 1


async def b_renders(samples: list[float], stop: asyncio.Event) -> None:
    offload.working_for("B")
    text, n = markdown(2_000), 0
    while not stop.is_set():
        began = time.perf_counter()
        await offload.run(partial(render_markdown, f"{text}{n}"), light=True)
        samples.append(time.perf_counter() - began)
        n += 1
        await asyncio.sleep(0.05)


async def measure(seconds: float) -> tuple[list[float], list[float]]:
    # Every worker started, its Markdown and lexers loaded: their start is not what is measured.
    await asyncio.gather(*(offload.run(partial(render_markdown, markdown(2_000)), light=True)
                           for _ in range(2 * offload.WORKERS)))
    alone: list[float] = []
    stop = asyncio.Event()
    b = asyncio.create_task(b_renders(alone, stop))
    await asyncio.sleep(seconds / 3)
    stop.set()
    await b
    loaded: list[float] = []
    stop = asyncio.Event()
    a = [asyncio.create_task(a_renders(markdown(60_000), True, stop)),
         asyncio.create_task(a_renders(markdown(400_000), False, stop))]
    await asyncio.sleep(1)  # A's work under way
    b = asyncio.create_task(b_renders(loaded, stop))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(b, *a)
    return alone, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="of A's load")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, CPU probe {cpu_probe():.1f} ms, {offload.WORKERS} workers")
    try:
        alone, loaded = asyncio.run(measure(args.seconds))
    finally:
        offload.shutdown()
    a50, a99, an = summary_ms(alone)
    l50, l99, ln = summary_ms(loaded)
    met = l99 <= 2 * a99
    print(table(["B's 2 KB render (ms)", "p50 alone", "p99 alone", "n", "p50 under A", "p99 under A", "max under A",
                 "n", "p99 ≤ 2x alone"],
                [("in a worker", a50, a99, an, l50, l99, max(loaded) * 1000, ln, "met" if met else "NOT met")]))


if __name__ == "__main__":
    main()
