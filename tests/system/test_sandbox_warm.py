"""Pre-started shell sandboxes (server/tools/sandbox/warm.py): each runs one command, one that no longer fits
the world's settings is never used, and none is left running once the pool or the server stops."""
from __future__ import annotations

import asyncio
import functools
import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

from server.testing.openai_double import OpenAIDouble
from server.tools.base import ToolContext
from server.tools.builtin import shell_tool
from server.tools.sandbox import bubblewrap as sandbox
from server.tools.sandbox import warm, world_users
from tests.fixtures.api import client_for, make_world, wait_until
from tests.fixtures.engine import reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually_async
from tests.fixtures.processes import processes_of, running_with
from tests.fixtures.server import start_server

pytestmark = pytest.mark.skipif(not sandbox.status().sandboxed, reason="needs bubblewrap")
APPROVE = json.dumps({"decision": "approve", "scope": "once"})


def running_in(path: Path) -> list[int]:
    """Pids of the processes whose command line names `path` (a sandbox's bwrap names its workspace)."""
    return running_with(str(path))


def tool_result(llm: OpenAIDouble, after: int) -> bool:
    return any(request.body["messages"][-1]["role"] == "tool" for request in llm.requests[after:])


def idle_pid(workspace: Path) -> int | None:
    pool = warm._pools.get(asyncio.get_running_loop())
    entry = pool.idle.get(workspace.resolve()) if pool else None
    return entry[1].pid if entry else None


async def shell(ctx: ToolContext, command: str, *, network: bool = False, timeout: int = 20) -> dict[str, Any]:
    tool = shell_tool(network=network)
    assert tool.run is not None
    result: dict[str, Any] = json.loads(await tool.run({"command": command, "timeout": timeout}, ctx))
    return result


async def next_idle(workspace: Path) -> int:
    """The workspace's next warm sandbox, once the pool has built it (it starts when a command ends)."""
    pool = warm._pools[asyncio.get_running_loop()]
    filling = pool.filling.get(workspace.resolve())
    if filling is not None:
        await asyncio.shield(filling)
    pid = idle_pid(workspace)
    assert pid is not None
    return pid


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(world="w", agent="a", chat="c", workspace=tmp_path / "workspace")


async def test_a_warm_sandbox_runs_one_command_and_a_fresh_one_replaces_it(ctx: ToolContext) -> None:
    warm.start()
    try:
        first = await shell(ctx, "touch /tmp/left-behind; ulimit -t")
        assert first["exit_code"] == 0 and first["output"] == "20\n", first
        ready = await next_idle(ctx.workspace)
        # Multi-line, a trailing newline and a here-doc reach the shell as they were written.
        second = await shell(ctx, "ls -A /tmp | grep -c left-behind\ncat <<EOF\n  two\\ lines \nEOF\n", timeout=7)
        assert second["output"] == "0\n  two\\ lines \n", second
        assert ready not in running_in(ctx.workspace.resolve())
        replacement = await next_idle(ctx.workspace)
        assert replacement != ready
        # A command's stdin is closed, as in a cold sandbox, and its CPU limit is its own timeout.
        third = await shell(ctx, "read line; echo read=$?; ulimit -t", timeout=3)
        assert third["output"] == "read=1\n3\n", third
    finally:
        await warm.stop()
    assert not running_in(ctx.workspace.resolve())


async def test_a_command_gets_a_shell_as_sh_c_would_give_it_warm_or_cold(ctx: ToolContext) -> None:
    # The shim runs the command in its own shell (no second exec of sh): nothing of the shim shows.
    probe = 'echo "args=$# t=${t-unset} c=${c-unset} l=${l-unset}"; f() { return 4; }; f; echo "f=$?"; exit 3'
    for pooled in (True, False):
        if pooled:
            warm.start()
        try:
            ran = await shell(ctx, probe)
            assert (ran["exit_code"], ran["output"]) == (3, "args=0 t=unset c=unset l=unset\nf=4\n"), ran
            broken = await shell(ctx, "if true")
            assert broken["exit_code"] == 2 and "Syntax error" in broken["output"], broken
            assert (await shell(ctx, "false"))["exit_code"] == 1
        finally:
            if pooled:
                await warm.stop()


async def test_everything_a_command_wrote_before_its_sandbox_ended_is_in_its_result(ctx: ToolContext) -> None:
    # The result is taken when the sandbox ends, not when its output pipe closes (its first process
    # holds that a few ms longer): what was written up to the end must all be there, every time.
    command = "head -c 60000 /dev/zero | tr '\\0' x; echo END"
    warm.start()
    try:
        for _ in range(30):
            ran = await shell(ctx, command)
            assert (ran["exit_code"], len(ran["output"]), ran["output"][-4:]) == (0, 60004, "END\n"), \
                (ran["exit_code"], len(ran["output"]), ran["output"][-20:])
    finally:
        await warm.stop()


async def test_a_warm_sandbox_built_without_network_is_never_used_once_the_network_is_allowed(
        ctx: ToolContext) -> None:
    interfaces = "cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' ' | sort | xargs"
    warm.start()
    try:
        closed = await shell(ctx, interfaces)
        assert closed["output"] == "lo\n", closed
        offline = await next_idle(ctx.workspace)
        opened = await shell(ctx, interfaces, network=True)
        assert opened["output"] == "lo tap0\n", opened  # a network of its own (netns.py)
        assert offline not in running_in(ctx.workspace.resolve())  # discarded, never given a command
        online = await next_idle(ctx.workspace)
        closed_again = await shell(ctx, interfaces)
        assert closed_again["output"] == "lo\n", closed_again
        assert online not in running_in(ctx.workspace.resolve())
    finally:
        await warm.stop()
    assert not running_in(ctx.workspace.resolve())


async def test_a_timed_out_command_in_a_warm_sandbox_is_killed_with_everything_it_started(
        ctx: ToolContext) -> None:
    warm.start()
    try:
        await shell(ctx, "true")
        await next_idle(ctx.workspace)
        result = await shell(ctx, "sleep 60 & sleep 60", timeout=1)
        assert result["timed_out"], result
        assert (await shell(ctx, "echo alive"))["output"] == "alive\n"
    finally:
        await warm.stop()
    left = running_in(ctx.workspace.resolve())
    assert not left, [Path(f"/proc/{p}/status").read_text()[:300] for p in left]


async def test_a_command_that_comes_before_the_next_sandbox_is_built_runs_cold_and_one_is_kept(
        ctx: ToolContext) -> None:
    # The next sandbox is started REFILL_DELAY after a command ends (off the result's path): a command
    # in between runs in a sandbox started for it, and the pool still ends with one idle sandbox.
    warm.start()
    try:
        await shell(ctx, "true")
        ready = await next_idle(ctx.workspace)
        first = await shell(ctx, "echo one")  # takes `ready`; its replacement is not started yet
        pool = warm._pools[asyncio.get_running_loop()]
        assert first["output"] == "one\n" and idle_pid(ctx.workspace) is None and pool.filling, first
        second = await shell(ctx, "echo two; ulimit -t", timeout=4)  # cold
        assert second["output"] == "two\n4\n", second
        kept = await next_idle(ctx.workspace)
        assert ready not in running_in(ctx.workspace.resolve())
        third = await shell(ctx, "echo three")
        assert third["output"] == "three\n", third
        assert kept not in running_in(ctx.workspace.resolve())
    finally:
        await warm.stop()
    assert not running_in(ctx.workspace.resolve())


async def test_a_pool_stopped_before_its_next_sandbox_is_started_starts_none(ctx: ToolContext) -> None:
    warm.start()
    try:
        await shell(ctx, "true")
        await next_idle(ctx.workspace)
        await shell(ctx, "true")  # its replacement waits REFILL_DELAY
        filling = list(warm._pools[asyncio.get_running_loop()].filling.values())
        assert filling
    finally:
        await warm.stop()
    assert all(task.done() for task in filling)
    assert not running_in(ctx.workspace.resolve())


def test_a_server_leaves_no_sandbox_running_when_it_stops(tmp_path: Path, llm_double: OpenAIDouble) -> None:
    server = start_server(tmp_path / "data", llm=llm_double)
    try:
        with client_for(server, server.token) as owner:
            world = make_world(owner, llm_double)
            for n in range(2):
                before = len(llm_double.requests)
                llm_double.respond_with(reply_by_turn(tool_calls(("shell_exec", {"command": f"echo run{n}"}))))
                assert owner.post(f"/api/worlds/{world}/messages", json={"content": "go"}).status_code == 201
                [pending] = wait_until(lambda: owner.get(f"/api/worlds/{world}/approvals/pending").json(),
                                       what="the approval")
                owner.post(f"/api/worlds/{world}/tool-results",
                           json={"role": "tool", "tool_call_id": pending["id"], "content": APPROVE})
                wait_until(functools.partial(tool_result, llm_double, before), what="the tool's result")
        workspace = (tmp_path / "data" / "workspaces" / world).resolve()
        assert wait_until(lambda: running_in(workspace), what="the next command's warm sandbox")
    finally:
        server.stop()  # SIGTERM: a graceful shutdown
    assert not running_in(workspace)


@pytest.mark.skipif(os.geteuid() != 0, reason="a user per world is how a server running as root runs tools")
async def test_a_fork_bomb_in_one_world_leaves_another_worlds_tools_their_process_slots(tmp_path: Path) -> None:
    # The process limit (256) counts a user's processes: with one user for every world (nobody), one
    # world's bomb left every other world's shell unable to fork.
    one, two = (ToolContext(world=w, agent="a", chat="c", workspace=tmp_path / "workspaces" / w)
                for w in ("one", "two"))
    # A bounded bomb: children that sleep a few seconds, as many as the limit lets it have.
    hold = ("import os, time\nkids = 0\nwhile kids < 400:\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n"
            "    kids += 1\nopen('full.part', 'w').write(str(kids))\nos.rename('full.part', 'full')\ntime.sleep(5)\n")
    bomb = asyncio.create_task(shell(one, f"python3 -c {shlex.quote(hold)}", timeout=20))
    await eventually_async(lambda: (one.workspace / "full").exists() or bomb.done(), timeout=20,
                           what="the bomb holding its user's process slots")
    assert not bomb.done(), bomb.result()
    assert int((one.workspace / "full").read_text()) >= 250
    alive = await shell(two, "echo alive $(id -un) $(id -u)")  # forks: there must be room for it
    assert alive["output"].startswith("alive sandbox "), alive
    uids = (world_users.sandbox_uid(one.workspace), world_users.sandbox_uid(two.workspace))
    assert alive["output"] == f"alive sandbox {uids[1]}\n" and uids[0] != uids[1], (alive, uids)
    assert processes_of(uids[0]) >= 250  # the bomb still held them
    await bomb


@pytest.mark.skipif(os.geteuid() != 0, reason="a user per world is how a server running as root runs tools")
async def test_a_workspace_of_the_former_shared_user_is_given_to_its_worlds_own(tmp_path: Path) -> None:
    ctx = ToolContext(world="old", agent="a", chat="c", workspace=tmp_path / "workspaces" / "old")
    (ctx.workspace / "notes").mkdir(parents=True)
    (ctx.workspace / "notes" / "todo.txt").write_text("before\n")
    for path in (ctx.workspace, ctx.workspace / "notes", ctx.workspace / "notes" / "todo.txt"):
        os.chown(path, 65534, 65534)  # as sessions before this one left it: nobody's
        path.chmod(0o755 if path.is_dir() else 0o644)
    changed = await shell(ctx, "echo after >> notes/todo.txt && cat notes/todo.txt && stat -c %u notes/todo.txt")
    uid = world_users.sandbox_uid(ctx.workspace)
    assert changed["output"] == f"before\nafter\n{uid}\n", changed


@pytest.mark.skipif(os.geteuid() != 0, reason="a user per world is how a server running as root runs tools")
async def test_a_tool_sees_neither_the_uid_registry_nor_another_world(tmp_path: Path) -> None:
    first, second = (ToolContext(world=w, agent="a", chat="c", workspace=tmp_path / "workspaces" / w)
                     for w in ("first", "second"))
    for ctx in (first, second):
        ran = await shell(ctx, "id -u; ls -A ..; ls ../.sandbox-uids 2>/dev/null || echo none")
        assert ran["output"].split() == [str(world_users.sandbox_uid(ctx.workspace)), ctx.world, "none"], ran
    assert (tmp_path / "workspaces" / world_users.UID_REGISTRY).is_dir()
    assert world_users.sandbox_uid(first.workspace) != world_users.sandbox_uid(second.workspace)


@pytest.mark.skipif(os.geteuid() != 0, reason="a user per world is how a server running as root runs tools")
def test_giving_a_workspace_over_leaves_what_lies_outside_it_alone(tmp_path: Path) -> None:
    # The walk runs as root over a folder a tool controls: a link out of it must not lend it anything.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("root's")
    workspace = tmp_path / "workspaces" / "linked"
    workspace.mkdir(parents=True)
    os.link(outside / "secret.txt", workspace / "hard.txt")  # (a tool could make one only on its own mount)
    (workspace / "soft").symlink_to(outside)
    (workspace / "mine.txt").write_text("the world's")
    for path in (workspace, workspace / "mine.txt"):
        os.chown(path, 65534, 65534)
    sandbox.prepare_workspace(workspace)
    uid = world_users.sandbox_uid(workspace)
    assert os.stat(workspace).st_uid == os.stat(workspace / "mine.txt").st_uid == uid
    assert os.stat(outside / "secret.txt").st_uid == 0 and os.stat(outside).st_uid == 0


async def test_a_world_still_runs_tools_after_a_tmp_cleaner_removed_the_identity_files(tmp_path: Path) -> None:
    # The passwd and group files bound over /etc's live in /tmp: systemd-tmpfiles (10 days on many
    # systems) may remove them from under a long-running server, and bwrap fails on a missing source.
    ctx = ToolContext(world="idle", agent="a", chat="c", workspace=tmp_path / "workspaces" / "idle")
    assert (await shell(ctx, "id -un"))["output"] == "sandbox\n"
    uid = world_users.sandbox_uid(ctx.workspace)
    shutil.rmtree(Path(world_users.identity_files(uid)[0]).parent)
    assert (await shell(ctx, "id -un"))["output"] == "sandbox\n"
