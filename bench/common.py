"""Helpers shared by the benchmarks: percentiles and a plain-text table."""
from __future__ import annotations

import statistics
import time
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary_ms(values: Sequence[float]) -> tuple[float, float, int]:
    """(p50, p99) in milliseconds of `values` in seconds, and the sample count."""
    return statistics.median(values) * 1000, percentile(values, 99) * 1000, len(values)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def cpu_probe(rounds: int = 15) -> float:
    """Milliseconds for a fixed pure-Python workload (median): how fast this shared machine is right now.

    Printed beside the figures so runs at different moments can be compared.
    """
    def work() -> int:
        total = 0
        for i in range(100_000):
            total += len({"i": i, "s": str(i)})
        return total
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000
