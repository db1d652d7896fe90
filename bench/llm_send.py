"""Sending one LLM request: the openai SDK's default httpx2 transport beside its aiohttp one.

    python bench/llm_send.py [--rounds 300]

Each round calls `OpenAIProvider.complete` with a small chat (8 messages, 8 tools) against the OpenAI
double in its own process, which stamps each request once its body is in. Measured: the call ->
the request at the double, and the part of it that holds the event loop before the provider first
waits (the SDK building and writing the request: on an agent's way from a tool result to its next LLM
call, nothing else runs meanwhile). The two transports alternate round by round, so that both see
the same machine. The server uses the aiohttp one (server/llm/openai_provider.py).
"""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_probe, summary_ms, table  # noqa: E402

WARMUP = 20
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are runner."},
    *({"role": "user", "content": f"run it {i}"} for i in range(5)),
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "shell_exec", "arguments": '{"command": "true"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"exit_code": 0, "output": ""}'},
]
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 10, "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}}}}} for i in range(8)]


async def measure(base_url: str, stamps: Any, rounds: int) -> dict[str, dict[str, list[float]]]:
    import openai

    from server.llm.openai_provider import OpenAIProvider

    httpx_provider = OpenAIProvider(api_key="x", base_url=base_url)
    # The SDK's default transport, as the provider used it before (the baseline of this run).
    httpx_provider._client = openai.AsyncOpenAI(api_key="x", base_url=base_url, max_retries=0)
    providers = {"httpx2 (SDK default)": httpx_provider, "aiohttp (openai[aiohttp])": OpenAIProvider(
        api_key="x", base_url=base_url)}
    out: dict[str, dict[str, list[float]]] = {name: {"sent": [], "held": []} for name in providers}
    try:
        for n in range(rounds + WARMUP):
            for name, provider in providers.items():
                started = time.time()
                call = asyncio.ensure_future(provider.complete(model="m", messages=MESSAGES, tools=TOOLS))
                await asyncio.sleep(0)  # the call runs until it first waits
                held = time.time() - started
                reply = await call
                arrived = float((await asyncio.to_thread(stamps.readline)).split()[1])
                if reply.finish is not None:
                    reply.finish()
                if n >= WARMUP:
                    out[name]["sent"].append(arrived - started)
                    out[name]["held"].append(held)
                await asyncio.sleep(0.005)
    finally:
        for provider in providers.values():
            await provider.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    print(f"CPU probe: {cpu_probe():.1f} ms; {args.rounds} rounds per transport, {WARMUP} warm-up")
    double = subprocess.Popen([sys.executable, str(ROOT / "bench" / "llm_double_proc.py")], stdout=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL)
    try:
        assert double.stdout is not None
        base_url = double.stdout.readline().split()[1]
        samples = asyncio.run(measure(base_url, double.stdout, args.rounds))
    finally:
        double.terminate()
        double.wait(10)
    rows = []
    for name, got in samples.items():
        sent, held = summary_ms(got["sent"]), summary_ms(got["held"])
        rows.append([name, sent[0], sent[1], held[0], held[1], sent[2]])
    print(table(["transport", "call -> request at the LLM, p50 ms", "p99 ms", "event loop held, p50 ms", "p99 ms",
                 "n"], rows))
    base, new = (statistics_of(samples, name) for name in samples)
    print(f"\nratio (aiohttp / httpx2), p50: call -> request {new[0] / base[0]:.2f}, loop held {new[1] / base[1]:.2f}")


def statistics_of(samples: dict[str, dict[str, list[float]]], name: str) -> tuple[float, float]:
    return summary_ms(samples[name]["sent"])[0], summary_ms(samples[name]["held"])[0]


if __name__ == "__main__":
    main()
