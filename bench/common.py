"""Helpers shared by the benchmarks: percentiles, a plain-text table, and a real `agent-world serve`."""
from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]


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
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(data_dir: Path, token: str, llm_url: str, args: Sequence[str] = (),
                 stderr: int | IO[bytes] = subprocess.DEVNULL) -> tuple[subprocess.Popen[bytes], str]:
    """`agent-world serve` on a free loopback port with the LLM at `llm_url`; returns it once /healthz answers.

    Uncapped connections per address: every simulated visitor comes from 127.0.0.1."""
    port = free_port()
    env = {**os.environ, "AGENT_WORLD_TOKEN": token, "OPENAI_BASE_URL": llm_url, "OPENAI_API_KEY": "x",
           "AGENT_WORLD_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--data-dir",
                             str(data_dir), "--no-demo", "--connections-per-address", "0", *args],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the server did not start")
