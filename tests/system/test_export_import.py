"""`agent-world export` / `import`: a world moves between embedded and distributed storage with every
event, seq and pending approval intact, and a pending approval carries on where it arrives."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.api import all_events, client_for, invite, make_world, wait_until
from tests.fixtures.cli import run_cli
from tests.fixtures.engine import open_engine, reply_by_turn, tool_calls
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.storage import delete_prefix, unique_name

DECIDE = {"role": "tool", "content": json.dumps({"decision": "approve", "scope": "once"})}


_cli = run_cli  # in this process: a subprocess would spend seconds importing the engine


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    prefix = unique_name("awport")
    yield prefix
    delete_prefix(redis_url, prefix)


def _pending(owner: httpx.Client, world: str) -> list[dict[str, Any]]:
    response = owner.get(f"/api/worlds/{world}/approvals/pending")
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()
    return events


def _world_with_a_pending_approval(server: ServerProcess, llm: OpenAIDouble) -> tuple[str, dict[str, Any]]:
    """A world where alice waits for approval of `echo moved-$((40+2))`, with an invite and a chat."""
    with client_for(server, server.token) as owner:
        world = make_world(owner, llm)
        invite(owner, world, "member", "mia")
        llm.respond_with(reply_by_turn(tool_calls(("shell_exec", {"command": "echo moved-$((40+2))"})),
                                       after_tools=Text("all done")))
        assert owner.post(f"/api/worlds/{world}/messages", json={"content": "please run it"}).status_code == 201
        [approval] = wait_until(lambda: _pending(owner, world), what="a pending approval", timeout=30)
        return world, approval


def _snapshot(server: ServerProcess, world: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with client_for(server, server.token) as owner:
        return all_events(owner, world), _pending(owner, world)


def _decide_and_finish(server: ServerProcess, llm: OpenAIDouble, world: str, approval: dict[str, Any]) -> None:
    """Approve on `server`: the tool runs there, its result is on the record and the agent answers."""
    requests_before = len(llm.requests)
    with client_for(server, server.token) as owner:
        decided = owner.post(f"/api/worlds/{world}/tool-results", json={**DECIDE, "tool_call_id": approval["id"]})
        assert decided.status_code == 201, decided.text
        call_id = approval["request"]["toolCallId"]
        result = wait_until(lambda: next((e for e in all_events(owner, world) if e.get("role") == "tool"
                                          and e.get("tool_call_id") == call_id), None),
                            what="the tool's result", timeout=30)
        assert "moved-42" in result["content"]
        wait_until(lambda: any(e.get("content") == "all done" for e in all_events(owner, world)),
                   what="the agent's answer after the tool", timeout=30)
        assert _pending(owner, world) == []
    assert len(llm.requests) == requests_before + 1  # the turn carried on once, with the result


def _export(world: str, *where: str) -> str:
    done = _cli("export", world, *where)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _import(path: Path, *where: str) -> subprocess.CompletedProcess[str]:
    return _cli("import", str(path), *where)


def test_a_pending_approval_moves_from_embedded_to_a_running_redis_deployment_and_runs_there(
        tmp_path: Path, llm_double: OpenAIDouble, redis_url: str, redis_prefix: str) -> None:
    embedded = start_server(tmp_path / "data", llm=llm_double)
    try:
        world, approval = _world_with_a_pending_approval(embedded, llm_double)
        before = _snapshot(embedded, world)
    finally:
        embedded.stop()
    exported = _export(world, "--data-dir", str(tmp_path / "data"))
    header = json.loads(exported.splitlines()[0])
    assert header["world"] == world and header["events"] == len(before[0]) == len(exported.splitlines()) - 1
    (tmp_path / "world.jsonl").write_text(exported)

    redis_where = ("--redis-url", redis_url, "--redis-prefix", redis_prefix)
    # A running distributed server hosts the imported world at once: the import announces it.
    distributed = start_server(tmp_path / "data2", llm=llm_double, args=["--no-demo", *redis_where])
    try:
        done = _import(tmp_path / "world.jsonl", *redis_where)
        assert done.returncode == 0, done.stderr
        assert _export(world, *redis_where) == exported  # the same events, seqs, open items, tags and claims
        assert _snapshot(distributed, world) == before
        _decide_and_finish(distributed, llm_double, world, approval)
    finally:
        distributed.stop()


def test_a_pending_approval_moves_from_redis_to_embedded_and_runs_there(
        tmp_path: Path, llm_double: OpenAIDouble, redis_url: str, redis_prefix: str) -> None:
    redis_where = ("--redis-url", redis_url, "--redis-prefix", redis_prefix)
    distributed = start_server(tmp_path / "data", llm=llm_double, args=["--no-demo", *redis_where])
    try:
        world, approval = _world_with_a_pending_approval(distributed, llm_double)
        before = _snapshot(distributed, world)
    finally:
        distributed.stop()
    exported = _export(world, *redis_where)
    (tmp_path / "world.jsonl").write_text(exported)

    fresh = tmp_path / "fresh"
    done = _import(tmp_path / "world.jsonl", "--data-dir", str(fresh))  # a new data folder is created
    assert done.returncode == 0, done.stderr
    assert f"imported world {world}: {len(before[0])} events" in done.stderr
    assert _export(world, "--data-dir", str(fresh)) == exported

    embedded = start_server(fresh, llm=llm_double)
    try:
        assert _snapshot(embedded, world) == before
        _decide_and_finish(embedded, llm_double, world, approval)
    finally:
        embedded.stop()


def test_import_refuses_an_existing_world_and_a_broken_file_and_writes_nothing(
        tmp_path: Path, llm_double: OpenAIDouble) -> None:
    server = start_server(tmp_path / "data", llm=llm_double)
    try:
        with client_for(server, server.token) as owner:
            world = make_world(owner, llm_double)
    finally:
        server.stop()
    where = ("--data-dir", str(tmp_path / "data"))
    lines = _export(world, *where).splitlines()
    (tmp_path / "same.jsonl").write_text("\n".join(lines) + "\n")
    again = _import(tmp_path / "same.jsonl", *where)
    assert again.returncode == 1 and f"world {world!r} already exists here: nothing imported" in again.stderr

    other = tmp_path / "other"
    gap = [lines[0], lines[1], *lines[3:]]  # seq 2 missing
    (tmp_path / "gap.jsonl").write_text("\n".join(gap) + "\n")
    broken = _import(tmp_path / "gap.jsonl", "--data-dir", str(other))
    assert broken.returncode == 1 and "has seq 3, expected 2" in broken.stderr
    (tmp_path / "junk.jsonl").write_text('{"hello": 1}\n')
    junk = _import(tmp_path / "junk.jsonl", "--data-dir", str(other))
    assert junk.returncode == 1 and "not an Agent World export header" in junk.stderr
    nothing = _cli("worlds", "--data-dir", str(other))
    assert nothing.returncode == 0 and nothing.stdout == ""
    missing = _cli("export", "nowhere", *where)
    assert missing.returncode == 1 and "no world 'nowhere'" in missing.stderr


def test_an_import_says_what_its_file_trusts_with_this_servers_powers(tmp_path: Path, llm_double: OpenAIDouble) -> None:
    server = start_server(tmp_path / "data", llm=llm_double)
    try:
        with client_for(server, server.token) as owner:
            world = make_world(owner, llm_double)  # alice's base_url is the double's
            servers = [{"name": "local-tools", "command": "true", "trusted": True},
                       {"name": "boxed", "command": "true"}, {"name": "far", "url": "https://mcp.example/mcp"}]
            settings = {"mcp_servers": servers, "sandbox_network": True}
            assert owner.patch(f"/api/worlds/{world}", json={"settings": settings}).status_code == 200
            rule = {"tool": "shell_exec", "match": {"command": "ls"}, "effect": "allow"}
            assert owner.post(f"/api/worlds/{world}/rules", json=rule).status_code == 201
        (tmp_path / "w.jsonl").write_text(_export(world, "--data-dir", str(tmp_path / "data")))
    finally:
        server.stop()
    done = _import(tmp_path / "w.jsonl", "--data-dir", str(tmp_path / "elsewhere"))
    assert done.returncode == 0, done.stderr
    assert "import only files you trust" in done.stderr
    assert "run unsandboxed with this server's rights: local-tools\n" in done.stderr
    assert f"sent this server's API key: {llm_double.base_url}" in done.stderr
    assert "1 allowance(s), which run matching calls without asking anyone, not imported" in done.stderr
    assert 'allow rule rule_' in done.stderr and 'shell_exec {"command": "ls"}' in done.stderr
    assert "connects to from its own network: far (https://mcp.example/mcp)" in done.stderr
    assert "sandbox_network: its tools reach the internet" in done.stderr


@pytest.mark.parametrize("world", ["..", "/", "../../../proc/self", "a/b", "Demo", ""])
def test_import_refuses_a_world_id_the_server_never_makes(tmp_path: Path, world: str) -> None:
    """The world id names the world's workspace folder (data/workspaces/<id>): an imported `..` made the data
    folder itself the workspace (file_read, which needs no approval, read session.key), `../../../proc/self`
    let it read the server's environment (AGENT_WORLD_TOKEN, OPENAI_API_KEY)."""
    header = {"format": "agent-world-export", "version": 1, "world": world, "events": 1, "claims": []}
    line = {"seq": 1, "event": {"kind": "world_created", "name": "W", "settings": {}, "sender": "server",
                                "ts": "2026-01-01T00:00:00.000Z"}, "open": ["world"], "tags": []}
    (tmp_path / "evil.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(line) + "\n")
    done = _import(tmp_path / "evil.jsonl", "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 1, done.stderr
    assert "world" in done.stderr
    nothing = _cli("worlds", "--data-dir", str(tmp_path / "data"))
    assert nothing.returncode == 0 and nothing.stdout == ""


@pytest.mark.parametrize("world", ["..", "/", "../../../proc/self", "a/../.."])
async def test_no_workspace_outside_the_workspaces_folder(tmp_path: Path, world: str) -> None:
    (tmp_path / "data").mkdir()
    engine, close = await open_engine(tmp_path / "data")
    try:
        with pytest.raises(ValueError):
            engine.workspace_for(world)
        assert engine.workspace_for("demo-1a2b3c") == tmp_path / "data" / "workspaces" / "demo-1a2b3c"
    finally:
        await close()
