"""Kill -9 right after an approve: does the approved call run exactly once, and say so?

A real `agent-world serve` (embedded mode), one agent whose LLM (the OpenAI double) asks for
`shell_exec` of `echo x >> ran-N.txt`. Each round sends the approve over HTTP and kills the server
with SIGKILL 0 to `--window-ms` ms after sending it (spread evenly over the rounds), restarts it,
waits for the call's result, and counts the lines of ran-N.txt (how many times the command ran).

    python bench/faults.py [--kills 120] [--window-ms 50]

Exit code 1 if any call ran twice.
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_probe, table  # noqa: E402
from server.testing.openai_double import OpenAIDouble, Text, ToolCalls  # noqa: E402
from tests.fixtures.server import start_server  # noqa: E402

START_TIMEOUT = 180.0  # seconds a (re)start may take on a loaded machine
RAN_ONCE = "ran once, with its output"
RAN_AFTER_RESTART = "never began before the kill; started after the restart, ran once, with its output"
RAN_INTERRUPTED = "ran once, reported interrupted"
NEVER_INTERRUPTED = "never ran, reported interrupted"
NOT_DECIDED = "decision not stored (still pending; the client had no answer)"
RAN_TWICE = "ran twice or more"
OTHER = "other (no result in 30 s)"


def respond(body: dict[str, Any]) -> Any:
    """`shell_exec` of what follows "run " in the last user message; "done" after a tool result."""
    if body["messages"][-1]["role"] == "tool":
        return Text("done")
    content = next((m.get("content") or "" for m in reversed(body["messages"]) if m["role"] == "user"), "")
    command = content.split("run ", 1)[1]
    return ToolCalls([(f"call_{time.monotonic_ns()}", "shell_exec", f'{{"command": {_json(command)}}}')])


def _json(text: str) -> str:
    import json
    return json.dumps(text)


def _wait(probe: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.02)
    return None


def one_round(server: Any, http: httpx.Client, world: str, n: int, delay: float) -> str:
    workspace = server.data_dir / "workspaces" / world
    http.post(f"/api/worlds/{world}/messages", json={"content": f"run echo x >> ran-{n}.txt; echo ran-{n}"})
    pending = _wait(lambda: http.get(f"/api/worlds/{world}/approvals/pending").json(), 15)
    if not pending:
        tail = http.get(f"/api/worlds/{world}/events", params={"after": 0}).json()[-6:]
        raise RuntimeError(f"round {n}: no approval was asked for; the log ends with {tail}")
    approval = pending[0]
    call_id = approval["request"]["toolCallId"]
    decision = {"role": "tool", "tool_call_id": approval["id"], "content": '{"decision": "approve", "scope": "once"}'}

    approver = httpx.Client(base_url=server.url, headers=server.headers, timeout=5)
    approver.get(f"/api/worlds/{world}/approvals/pending")  # connected and warm: the approve goes out at once
    sent = threading.Event()

    def approve() -> None:
        try:
            sent.set()
            approver.post(f"/api/worlds/{world}/tool-results", json=decision)
        except httpx.HTTPError:
            pass  # killed under it
    sender = threading.Thread(target=approve)
    sender.start()
    sent.wait()
    started = time.perf_counter()
    time.sleep(max(0.0, started + delay - time.perf_counter()))
    server.kill()
    sender.join()
    approver.close()
    server.start(START_TIMEOUT)

    def result() -> dict[str, Any] | None:
        events = http.get(f"/api/worlds/{world}/events", params={"after": 0, "limit": 100000}).json()
        return next((e for e in events if e.get("role") == "tool" and not e.get("decision")
                     and e.get("tool_call_id") == call_id), None)
    undecided = any(p["id"] == approval["id"] for p in http.get(f"/api/worlds/{world}/approvals/pending").json())
    if undecided:  # killed before the decision was stored: finish the call before the next round
        http.post(f"/api/worlds/{world}/tool-results", json=decision)
    outcome = _wait(result, 30)
    ran_file = workspace / f"ran-{n}.txt"
    runs = len(ran_file.read_text().splitlines()) if ran_file.exists() else 0
    if outcome is not None:  # the agent's answer to the result ends the turn: then the next round may start
        _wait(lambda: any(e.get("content") == "done" for e in
                          http.get(f"/api/worlds/{world}/events", params={"after": outcome["seq"]}).json()), 15)
    if undecided:
        return RAN_TWICE if runs >= 2 else NOT_DECIDED
    if outcome is None:
        return OTHER
    interrupted = "interrupted" in outcome["content"]
    if runs >= 2:
        return RAN_TWICE
    if runs == 1:
        if interrupted:
            return RAN_INTERRUPTED
        events = http.get(f"/api/worlds/{world}/events", params={"after": 0}).json()
        restarted = any(e.get("kind") == "tool_started" and e.get("call_id") == call_id and e.get("retry")
                        for e in events)
        return RAN_AFTER_RESTART if restarted else RAN_ONCE
    return NEVER_INTERRUPTED if interrupted else OTHER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=120)
    parser.add_argument("--window-ms", type=float, default=50.0)
    args = parser.parse_args(argv)
    probe = cpu_probe()
    outcomes: collections.Counter[str] = collections.Counter()
    by_delay: dict[str, list[float]] = collections.defaultdict(list)
    with OpenAIDouble() as llm, tempfile.TemporaryDirectory() as tmp:
        llm.respond_with(respond)
        server = start_server(Path(tmp) / "data", llm=llm, timeout=START_TIMEOUT)
        try:
            with httpx.Client(base_url=server.url, headers=server.headers, timeout=10) as http:
                world = http.post("/api/worlds", json={"name": "Faults"}).json()["id"]
                http.post(f"/api/worlds/{world}/agents", json={"name": "alice", "provider": "openai", "model": "m",
                                                               "base_url": llm.base_url})
                for n in range(args.kills):
                    delay = args.window_ms / 1000 * n / max(1, args.kills - 1)
                    outcome = one_round(server, http, world, n, delay)
                    outcomes[outcome] += 1
                    by_delay[outcome].append(delay * 1000)
                    print(f"round {n + 1}/{args.kills}: kill at {delay * 1000:.1f} ms: {outcome}", file=sys.stderr)
        finally:
            server.stop()
    print(f"kill -9 at 0-{args.window_ms:g} ms after sending an approve, {args.kills} rounds "
          f"(CPU probe {probe:.1f} ms)")
    names = (RAN_ONCE, RAN_AFTER_RESTART, RAN_INTERRUPTED, NEVER_INTERRUPTED, NOT_DECIDED, RAN_TWICE, OTHER)
    rows = [(name, outcomes[name], f"{min(by_delay[name]):.1f}-{max(by_delay[name]):.1f}" if by_delay[name] else "-")
            for name in names]
    print(table(["outcome", "calls", "kill delays (ms)"], rows))
    return 1 if outcomes[RAN_TWICE] else 0


if __name__ == "__main__":
    sys.exit(main())
