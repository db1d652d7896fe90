"""Issue #11 fault 2: a call whose start was written but which provably never began is started after
a crash, not reported "interrupted". The process really dies (os._exit) at that exact point."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from server.testing.openai_double import OpenAIDouble
from tests.fixtures.engine import Harness, open_engine, run_on_request
from tests.fixtures.server import ROOT

_CHILD = textwrap.dedent('''
    import asyncio, json, os, sys
    sys.path.insert(0, {root!r})
    from server import vocab
    from server.engine.actors import Actor
    from tests.fixtures.engine import open_engine

    async def main():
        engine, _ = await open_engine(__import__("pathlib").Path({data!r}))
        owner = Actor("olivia", vocab.OWNER)
        world = (await engine.create_world(owner, "Crash", agents=[
            {{"name": "alice", "provider": "openai", "model": "m", "base_url": {llm!r}}}]))["id"]
        print(world, flush=True)
        await engine.post_message(world, owner, "run echo x >> ran.txt; echo ran")
        while not (pending := await engine.pending_approvals(world)):
            await asyncio.sleep(0.01)
        engine.executor.launch = lambda call: os._exit(137)  # dies right after the start is written
        await engine.submit_tool_result(world, owner, {{"role": "tool", "tool_call_id": pending[0]["id"],
                                                        "content": json.dumps({{"decision": "approve"}})}})

    asyncio.run(main())
''')


async def test_a_call_started_but_never_begun_runs_after_a_crash(tmp_path: Path, llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(run_on_request)
    child = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT), data=str(tmp_path),
                                                                 llm=llm_double.base_url)],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 137, child.stderr
    world = child.stdout.split()[0]
    engine, close = await open_engine(tmp_path)  # the restart
    try:
        harness = Harness(engine, llm_double, world=world, agents=["alice"])
        [result] = await harness.wait_for(lambda e: e.get("role") == "tool" and not e.get("decision"), timeout=10)
        assert "interrupted" not in result["content"] and json.loads(result["content"])["output"] == "ran\n"
        await harness.wait_for(lambda e: e.get("content") == "done")
        await asyncio.sleep(0.3)  # nothing runs it a second time
        assert (tmp_path / "workspaces" / world / "ran.txt").read_text() == "x\n"
        started = [e for e in await harness.events() if e.get("kind") == "tool_started"]
        assert [e["retry"] for e in started] == [True]  # started again, once, after the restart
    finally:
        await close()
