"""Kill -9 the process with approvals pending or a tool running; a new process resumes from the log."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from server import vocab
from server.engine.turns.runner import INTERRUPTED
from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.engine import OWNER, open_engine, reply_by_turn, tool_calls

CHILD = Path(__file__).parents[1] / "fixtures" / "engine_child.py"


def _crash_after(data_dir: Path, double: OpenAIDouble, mode: str) -> str:
    """Run the child until READY, then SIGKILL its whole process group; returns the world id."""
    child = subprocess.Popen([sys.executable, str(CHILD), str(data_dir), double.base_url, mode],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = child.stdout.readline().decode()  # type: ignore[union-attr]
        assert line.startswith("READY"), child.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
    return line.split()[1]


async def _wait_final(engine: object, world: str, text: str) -> None:
    for _ in range(500):
        events = await engine.events(world)  # type: ignore[attr-defined]
        if any(e.get("content") == text for e in events):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no final reply {text!r}")


def _runs(data_dir: Path, world: str) -> list[str]:
    path = data_dir / "workspaces" / world / "count.txt"
    return path.read_text().splitlines() if path.exists() else []


async def test_pending_approval_survives_kill_and_runs_exactly_once(tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "echo run >> count.txt"})),
                                          after_tools=Text("all done")))
    world = _crash_after(tmp_path, llm_double, "pending")

    engine, close = await open_engine(tmp_path)
    try:
        [pending] = await engine.pending_approvals(world)
        assert pending["request"]["toolName"] == "shell_exec"
        await engine.submit_tool_result(world, OWNER, {"role": "tool", "tool_call_id": pending["id"],
                                                       "content": json.dumps({"decision": "approve"})})
        await _wait_final(engine, world, "all done")
    finally:
        await close()
    # and once more: a second restart runs nothing again
    engine, close = await open_engine(tmp_path)
    try:
        events = await engine.events(world)
        assert [e["content"] for e in events if e.get("role") == "assistant" and e.get("content")] == ["all done"]
        assert await engine.store.log.list_open(world, "turn:") == []
    finally:
        await close()
    assert _runs(tmp_path, world) == ["run"]
    assert len(llm_double.requests) == 2


async def test_a_tool_running_when_the_process_died_is_reported_interrupted_not_rerun(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(reply_by_turn(
        lambda: tool_calls(("shell_exec", {"command": "echo start >> count.txt; sleep 20; echo end >> count.txt"})),
        after_tools=Text("noted")))
    world = _crash_after(tmp_path, llm_double, "running")

    engine, close = await open_engine(tmp_path)
    try:
        await _wait_final(engine, world, "noted")
        last = llm_double.requests[-1].body["messages"][-1]
        assert last["role"] == "tool"
        assert json.loads(last["content"]) == {"error": INTERRUPTED}
        events = await engine.events(world)
        assert len([e for e in events if vocab.started_by(e)]) == 1
    finally:
        await close()
    assert _runs(tmp_path, world) == ["start"]
