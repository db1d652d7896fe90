"""How fast `/healthz` answers while a sandboxed fork bomb runs, beside the same probe on an idle server.

    python bench/fork_bomb.py [--probes 50]

A real `agent-world serve` (embedded mode, bubblewrap sandbox), one agent whose LLM (the OpenAI double)
asks for `shell_exec` of a fork bomb with a 4 s timeout; an owner approves it. The baseline probes
/healthz the same way on the same server before the bomb. The sandbox's process limit is what keeps
the server answering (tests/system/test_sandbox.py checks that it answers at all and that the bomb is stopped);
this script measures how fast. Target: p99 under 2 s during the bomb.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_probe, summary_ms, table  # noqa: E402
from server.testing.openai_double import OpenAIDouble  # noqa: E402
from tests.fixtures.api import client_for, make_world  # noqa: E402
from tests.fixtures.engine import reply_by_turn, tool_calls  # noqa: E402
from tests.fixtures.server import start_server  # noqa: E402

BOMB = "bomb() { bomb | bomb & }; bomb; exec sleep 5"
APPROVE = json.dumps({"decision": "approve", "scope": "once"})


def _probe(url: str) -> float:
    asked = time.perf_counter()
    assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
    return time.perf_counter() - asked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probes", type=int, default=50, help="baseline probes before the bomb")
    args = parser.parse_args()
    probe_ms = cpu_probe()
    with OpenAIDouble() as llm, tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "data", llm=llm)
        try:
            with client_for(server, server.token) as owner:
                world = make_world(owner, llm)
                idle = []
                for _ in range(args.probes):
                    idle.append(_probe(server.url))
                    time.sleep(0.1)
                before = len(llm.requests)
                llm.respond_with(reply_by_turn(tool_calls(("shell_exec", {"command": BOMB, "timeout": 4}))))
                owner.post(f"/api/worlds/{world}/messages", json={"content": "go"})
                pending: list[dict[str, str]] = []
                while not pending:
                    pending = owner.get(f"/api/worlds/{world}/approvals/pending").json()
                    time.sleep(0.05)
                owner.post(f"/api/worlds/{world}/tool-results",
                           json={"role": "tool", "tool_call_id": pending[0]["id"], "content": APPROVE})
                during = []
                deadline = time.monotonic() + 60
                while not any(r.body["messages"][-1]["role"] == "tool" for r in llm.requests[before:]):
                    if time.monotonic() > deadline:
                        raise SystemExit("the fork bomb's result never came")
                    during.append(_probe(server.url))
                    time.sleep(0.1)
        finally:
            server.stop()
    rows = [("idle (baseline)", *summary_ms(idle), f"{max(idle) * 1000:.0f}"),
            ("during the fork bomb", *summary_ms(during), f"{max(during) * 1000:.0f}")]
    print(f"CPU probe {probe_ms:.1f} ms")
    print(table(["/healthz", "p50 ms", "p99 ms", "n", "max ms"], rows))


if __name__ == "__main__":
    main()
