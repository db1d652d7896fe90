"""Tool processes run sandboxed (issue #10, finding 1): against a real `agent-world serve`, an approved
shell command sees no secret, no data and no network, and cannot exhaust the machine."""
from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from server import trip_files
from server.testing.openai_double import OpenAIDouble
from server.tools.base import ToolContext, ToolError
from server.tools.builtin import builtin_tools
from server.tools.sandbox import bubblewrap as sandbox
from server.tools.sandbox import world_users
from tests.fixtures.api import client_for, make_world, wait_until
from tests.fixtures.engine import reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually
from tests.fixtures.server import ServerProcess, start_server
from tests.fixtures.tools import ECHO_SERVER

APPROVE = json.dumps({"decision": "approve", "scope": "once"})
SQLITE_MAGIC = "SQLite format 3"
API_KEY = "sk-sandbox-test-" + secrets.token_hex(16)


@pytest.fixture
def secret_server(tmp_path: Path, llm_double: OpenAIDouble) -> Iterator[ServerProcess]:
    """A server holding an OpenAI key of its own (its owner token is in its environment too)."""
    process = start_server(tmp_path / "data", llm=llm_double, extra_env={"OPENAI_API_KEY": API_KEY})
    try:
        yield process
    finally:
        process.stop()


@dataclass
class Lab:
    """A world on a running server, with the owner's client: alice runs the tools we ask for."""

    server: ServerProcess
    llm: OpenAIDouble
    owner: httpx.Client
    world: str

    def run_tool(self, name: str, args: dict[str, Any], timeout: float = 30.0) -> str:
        """Alice calls `name` with `args`; any approval it asks for is given. Returns the tool's output as
        the LLM received it (unredacted: what the tool really printed)."""
        before = len(self.llm.requests)
        self.llm.respond_with(reply_by_turn(tool_calls((name, args))))
        assert self.owner.post(f"/api/worlds/{self.world}/messages", json={"content": "go"}).status_code == 201

        def result() -> str | None:
            for pending in self.owner.get(f"/api/worlds/{self.world}/approvals/pending").json():
                self.owner.post(f"/api/worlds/{self.world}/tool-results",
                                json={"role": "tool", "tool_call_id": pending["id"], "content": APPROVE})
            return tool_result(self.llm, before)
        return wait_until(result, timeout, what=f"the result of {name}")

    def shell(self, command: str, timeout: int = 20) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.run_tool("shell_exec", {"command": command, "timeout": timeout},
                                                          timeout + 20))
        return result


def tool_result(llm: OpenAIDouble, after: int) -> str | None:
    """The first tool result the LLM received after its `after` first requests."""
    for request in llm.requests[after:]:
        if request.body["messages"][-1]["role"] == "tool":
            content: str = request.body["messages"][-1]["content"]
            return content
    return None


@pytest.fixture
def lab(secret_server: ServerProcess, llm_double: OpenAIDouble) -> Iterator[Lab]:
    with client_for(secret_server, secret_server.token) as owner:
        yield Lab(secret_server, llm_double, owner, make_world(owner, llm_double))


def test_an_approved_shell_command_reads_no_secret_and_no_data(lab: Lab) -> None:
    data = lab.server.data_dir.resolve()
    text = lab.shell(f"cat /proc/$PPID/environ; cat /proc/1/environ; env; ls -la {data}; "
                     f"cat {data}/agent-world.sqlite3; cat ../../agent-world.sqlite3; ls /proc")["output"]
    assert "PATH=" in text  # it ran
    assert lab.server.token not in text
    assert API_KEY not in text
    assert SQLITE_MAGIC not in text
    # No server process is visible: the sandbox has a /proc of its own, with a handful of pids.
    pids = [line for line in text.splitlines() if line.isdigit()]
    assert pids and len(pids) < 10, pids


def test_a_link_into_the_data_folder_can_be_neither_made_nor_followed(lab: Lab) -> None:
    data = lab.server.data_dir.resolve()
    made = lab.shell(f"ln ../../agent-world.sqlite3 hard.db; ln {data}/agent-world.sqlite3 hard2.db; "
                     f"ln -s {data}/agent-world.sqlite3 soft.db; ln -s ../../agent-world.sqlite3 rel.db; ls -la")
    assert SQLITE_MAGIC not in made["output"]
    for planted in ("hard.db", "hard2.db", "soft.db", "rel.db"):
        read = lab.run_tool("file_read", {"path": planted})
        assert SQLITE_MAGIC not in read and '"error"' in read, (planted, read)
    workspace = data / "workspaces" / lab.world
    assert not any(p.exists() and p.stat().st_nlink > 1 for p in workspace.iterdir() if not p.is_symlink())


async def test_file_tools_refuse_a_hard_link_planted_outside_the_sandbox(tmp_path: Path) -> None:
    # With --unsafe-no-sandbox a command can make a hard link: file_read must still not read through it.
    secret = tmp_path / "agent-world.sqlite3"
    secret.write_text(SQLITE_MAGIC)
    workspace = tmp_path / "workspaces" / "w"
    workspace.mkdir(parents=True)
    os.link(secret, workspace / "db")
    ctx = ToolContext(world="w", agent="a", chat="c", workspace=workspace)
    tools = {tool.name: tool for tool in builtin_tools()}
    owner = secret.stat().st_uid
    read, write = tools["file_read"].run, tools["file_write"].run
    assert read is not None and write is not None  # server tools
    with pytest.raises(ToolError, match="hard links"):
        await read({"path": "db"}, ctx)
    with pytest.raises(ToolError, match="hard links"):
        await write({"path": "db", "content": "overwritten"}, ctx)
    assert secret.read_text() == SQLITE_MAGIC
    # Nor is it given to the world's user (a root server gives a workspace over on first use): the
    # sandboxed shell could then read and write the file through the link.
    assert secret.stat().st_uid == owner


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a workspace over is what a server running as root does")
def test_giving_a_workspace_over_never_follows_a_folder_swapped_for_a_link(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Root gives an old workspace to its world's user while a tool of that world may already run in it
    # (a second walk, another replica's): a folder swapped for a link mid-walk must not lead it out.
    outside = tmp_path / "etc"
    (outside / "sub").mkdir(parents=True)
    for name in ("f1", "f2", "sub/f3"):
        (outside / name).write_text("the host's")
    workspace = tmp_path / "workspaces" / "w"
    folder = workspace / "p" / "a"
    (folder / "sub").mkdir(parents=True)
    for name in ("f1", "f2", "sub/f3"):
        (folder / name).write_text("the world's")
    for path in (workspace, workspace / "p", folder, *folder.rglob("*")):
        os.chown(path, 65534, 65534)
    uid = 54321
    monkeypatch.setattr(sandbox, "file_owner", lambda _: (uid, uid))
    chown, swapped = os.chown, list[Path]()

    def racing_chown(path: Any, *owner: int, dir_fd: int | None = None, follow_symlinks: bool = True) -> None:
        where = Path(os.readlink(f"/proc/self/fd/{dir_fd}")) / path if dir_fd is not None else Path(path)
        if where.parent == folder and not swapped:  # the tool, owning p/ by now, swaps p/a for a link
            folder.rename(folder.with_name("a.old"))
            folder.symlink_to(outside)
            swapped.append(where)
        chown(path, *owner, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "chown", racing_chown)
    sandbox.prepare_workspace(workspace)
    assert swapped
    assert {p.relative_to(outside).as_posix(): p.lstat().st_uid for p in outside.rglob("*")} == {
        "f1": 0, "f2": 0, "sub": 0, "sub/f3": 0}
    assert workspace.stat().st_uid == uid


def test_an_untrusted_mcp_server_cannot_touch_the_data_folder(lab: Lab) -> None:
    database = lab.server.data_dir.resolve() / "agent-world.sqlite3"
    servers = [{"name": "echo", "command": sys.executable, "args": [ECHO_SERVER]}]
    assert lab.owner.patch(f"/api/worlds/{lab.world}", json={"settings": {"mcp_servers": servers}}).status_code == 200
    wait_until(lambda: "echo__count" in {t["name"] for t in lab.owner.get(f"/api/worlds/{lab.world}").json()["tools"]},
               what="the MCP server's tools")
    before = database.read_bytes()[:100]
    # `count` appends a line to the file it is given: here, the server's database.
    result = lab.run_tool("echo__count", {"path": str(database)})
    assert '"error"' in result, result
    assert database.read_bytes()[:100] == before and not database.read_bytes().endswith(b"x\n")


def test_an_mcp_server_of_a_world_that_allows_the_network_has_a_network_of_its_own(lab: Lab) -> None:
    servers = [{"name": "echo", "command": sys.executable, "args": [ECHO_SERVER]}]
    settings = {"mcp_servers": servers, "sandbox_network": True}
    assert lab.owner.patch(f"/api/worlds/{lab.world}", json={"settings": settings}).status_code == 200
    wait_until(lambda: "echo__count" in {t["name"] for t in lab.owner.get(f"/api/worlds/{lab.world}").json()["tools"]},
               what="the MCP server's tools")

    def the_server() -> str | None:  # the process running the script itself (not its launcher or bwrap)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if argv[1:2] == [ECHO_SERVER.encode()]:
                    return pid
            except OSError:
                continue
        return None
    pid = wait_until(the_server, what="the MCP server's process")
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    interfaces = [line.split(":")[0].strip() for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]]
    assert sorted(interfaces) == ["lo", "tap0"], interfaces


def test_a_path_named_on_an_mcp_command_line_never_uncovers_the_data_folder(tmp_path: Path) -> None:
    data = (tmp_path / "data").resolve()
    (data / "workspaces" / "w").mkdir(parents=True)
    (data / "agent-world.sqlite3").write_text(SQLITE_MAGIC)
    sandbox.configure(hidden=[data])
    try:
        # The folder holding the data folder, and the home folder, named as if they were a script's.
        argv = sandbox.wrap(["sh", "-c", f"ls {data} {tmp_path} ~ /; cat {data}/agent-world.sqlite3"],
                            workspace=None, read_only=[tmp_path, Path.home(), Path("/")])
        shown = subprocess.run(argv, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    finally:
        sandbox.configure()
    assert SQLITE_MAGIC not in shown.stdout and "agent-world.sqlite3" not in shown.stdout, shown.stdout
    # Not there at all (not merely unreadable), and / is still the sandbox's own, not the host's.
    assert f"cannot access '{data}': No such file or directory" in shown.stderr, shown.stderr
    listed = shown.stdout.split()
    assert "proc" in listed and "var" not in listed, listed


def test_the_memory_where_work_travels_to_the_workers_is_never_shown(tmp_path: Path) -> None:
    """Work for the worker processes, the secrets redaction looks for included, travels in files in
    /dev/shm (server/trip_files.py): a tool naming it, or /dev, sees the sandbox's own /dev/shm."""
    folder = Path(tempfile.mkdtemp(prefix="agent-world-trips-", dir=trip_files.MEMORY))
    (folder / "x.work").write_text("a secret the server knows")
    sandbox.configure(hidden=[tmp_path])
    try:
        argv = sandbox.wrap(["sh", "-c", f"ls -a /dev/shm; cat {folder}/x.work"], workspace=None,
                            read_only=[trip_files.MEMORY, Path("/dev"), folder])
        shown = subprocess.run(argv, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    finally:
        sandbox.configure()
        shutil.rmtree(folder)
    assert "a secret" not in shown.stdout and folder.name not in shown.stdout, shown.stdout
    assert "No such file or directory" in shown.stderr, shown.stderr


def host_addresses() -> list[str]:
    """This machine's own IPv4 addresses but loopback's (where an app bound to 0.0.0.0 answers)."""
    shown = json.loads(subprocess.run(["ip", "-json", "-4", "addr", "show"], capture_output=True, check=True).stdout)
    return [a["local"] for link in shown for a in link.get("addr_info", ())
            if a.get("family") == "inet" and not a["local"].startswith("127.")]


def connect_to_each(addresses: list[tuple[str, int]]) -> str:
    """A command that tries each address and prints `CONNECTED address` or `UNREACHED address why`."""
    script = ("import socket\n"
              f"for host, port in {addresses!r}:\n"
              "    try: socket.create_connection((host, port), 3).close(); print('CONNECTED', host, port)\n"
              "    except OSError as exc: print('UNREACHED', host, port, exc)\n")
    return f"python3 -c {shlex.quote(script)}"


def test_the_shell_has_no_network_unless_the_world_allows_it_and_then_none_of_the_hosts(lab: Lab) -> None:
    # The server's own port on loopback (also the host's loopback seen through slirp4netns' gateway),
    # and an app listening on every address of the host, as a Redis or a replica might be.
    with socket.create_server(("0.0.0.0", 0)) as everywhere:
        everywhere.setblocking(False)
        port = everywhere.getsockname()[1]
        targets = [("127.0.0.1", lab.server.port), ("10.0.2.2", lab.server.port), ("127.0.0.1", port),
                   *((address, port) for address in host_addresses())]
        assert len(targets) > 3, "the host has an address besides loopback"
        closed = lab.shell(connect_to_each(targets))
        assert "CONNECTED" not in closed["output"] and "Network is unreachable" in closed["output"], closed
        changed = lab.owner.patch(f"/api/worlds/{lab.world}", json={"settings": {"sandbox_network": True}})
        assert changed.status_code == 200 and changed.json()["settings"]["sandbox_network"] is True
        opened = lab.shell(connect_to_each(targets) + "; cut -d: -f1 /proc/net/dev | tail -n +3")
        # It has a network (an interface of its own beside loopback), but nothing of the host's answers.
        assert "tap0" in opened["output"], opened
        assert "CONNECTED" not in opened["output"], opened
        assert opened["output"].count("UNREACHED") == len(targets), opened
        with pytest.raises(BlockingIOError):
            everywhere.accept()
    refused = lab.owner.patch(f"/api/worlds/{lab.world}", json={"settings": {"sandbox_network": "yes"}})
    assert refused.status_code == 400


# PTRACE_TRACEME (0): the least a tracer needs; it prints "0 Success" where ptrace is allowed.
PTRACE = ("python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
          "print(\"ptrace:\", libc.ptrace(0, 0, 0, 0), os.strerror(ctypes.get_errno()))'")
# What tools never need, each run on its own: a user namespace's "root" with network-admin rights,
# a namespace's by another call, and a mount (even as the sandbox's root, in the unprivileged case).
REFUSED = ("unshare -Urn true", "unshare -r true", "unshare --user --map-root-user --mount true")


def test_the_shell_cannot_make_a_user_namespace_nor_trace_a_process(lab: Lab) -> None:
    # Twice: a cold sandbox and a warm one; then in the sandbox that has a network of its own.
    for network in (False, False, True):
        if network:
            lab.owner.patch(f"/api/worlds/{lab.world}", json={"settings": {"sandbox_network": True}})
        for command in REFUSED:
            refused = lab.shell(f"{command}; echo status=$?")
            assert "Operation not permitted" in refused["output"], (network, refused)
            assert "status=0" not in refused["output"], (network, refused)
        traced = lab.shell(PTRACE)
        assert "ptrace: -1 Operation not permitted" in traced["output"], (network, traced)


def test_ordinary_commands_still_work_under_the_seccomp_filter(lab: Lab) -> None:
    worked = lab.shell("ls / > /dev/null && echo listed; python3 -c 'import threading, subprocess; "
                       "t = threading.Thread(target=print, args=(\"threaded\",)); t.start(); t.join(); "
                       "subprocess.run([\"echo\", \"spawned\"])'; git init -q repo && echo git-ok; "
                       "python3 -m pip --version > /dev/null && echo pip-ok; sh -c 'echo piped | cat'")
    assert worked["exit_code"] == 0, worked
    for said in ("listed", "threaded", "spawned", "git-ok", "pip-ok", "piped"):
        assert said in worked["output"], (said, worked)


def test_an_mcp_servers_sandbox_has_the_same_filter(tmp_path: Path) -> None:
    # What an MCP client runs: the command line alone (it passes no descriptors), started elsewhere.
    argv = sandbox.wrap(["sh", "-c", f"unshare -Urn true; echo status=$?; {PTRACE}"], workspace=None,
                        limits=sandbox.SERVER_LIMITS)
    shown = subprocess.run(argv, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    assert "Operation not permitted" in shown.stderr and "status=1" in shown.stdout, shown
    assert "ptrace: -1 Operation not permitted" in shown.stdout, shown


def test_process_count_and_memory_are_limited(lab: Lab) -> None:
    # A bounded burst (so that running this on unsandboxed code cannot take the machine down).
    burst = lab.shell("(for i in $(seq 1000); do (echo x >> started.txt; sleep 2) & done) 2>/dev/null; "
                      "sleep 3; echo started $(wc -l < started.txt)")
    started = int(burst["output"].split("started")[-1].split()[0])
    assert 10 < started < 300, burst
    hog = lab.shell("python3 -c 'b = bytearray(6 << 30); print(\"ALLOCATED\")'")
    assert "ALLOCATED" not in hog["output"] and "MemoryError" in hog["output"], hog


def test_a_fork_bomb_is_contained_while_the_server_answers(lab: Lab) -> None:
    before = len(lab.llm.requests)
    lab.llm.respond_with(reply_by_turn(tool_calls(
        ("shell_exec", {"command": "bomb() { bomb | bomb & }; bomb; exec sleep 5", "timeout": 4}))))
    assert lab.owner.post(f"/api/worlds/{lab.world}/messages", json={"content": "go"}).status_code == 201
    [pending] = wait_until(lambda: lab.owner.get(f"/api/worlds/{lab.world}/approvals/pending").json(),
                           what="the approval")
    lab.owner.post(f"/api/worlds/{lab.world}/tool-results",
                   json={"role": "tool", "tool_call_id": pending["id"], "content": APPROVE})
    answered: list[int] = []

    def healthz_then_result() -> str | None:
        """The server answers /healthz while the bomb runs (how fast: bench/fork_bomb.py); then the result."""
        answered.append(httpx.get(f"{lab.server.url}/healthz", timeout=30).status_code)
        return tool_result(lab.llm, before)
    result = eventually(healthz_then_result, timeout=60, interval=0.2, what="the fork bomb to be stopped")
    assert answered and set(answered) == {200}, answered
    assert result is not None  # for the type checker: `eventually` returns a truthy value
    assert json.loads(result)["timed_out"]
    # Tools still run afterwards: nothing of the bomb is left holding the process slots.
    assert lab.shell("echo alive")["output"] == "alive\n"


def test_without_a_sandbox_the_server_says_why_and_offers_no_shell(tmp_path: Path,
                                                                   llm_double: OpenAIDouble) -> None:
    process = start_server(tmp_path / "data", llm=llm_double, extra_env={"AGENT_WORLD_BWRAP": "/nonexistent"})
    try:
        lines = [line for line in process.log().splitlines() if line.startswith("Tool sandbox")]
        assert lines == ["Tool sandbox unavailable (bubblewrap not found: /nonexistent): shell tools are off "
                         "and untrusted MCP servers do not start (--unsafe-no-sandbox runs them unsandboxed)"]
        with client_for(process, process.token) as owner:
            world = make_world(owner, llm_double)
            info = owner.get(f"/api/worlds/{world}").json()
            assert "shell_exec" not in {tool["name"] for tool in info["tools"]}
            assert "bubblewrap not found" in info["tool_errors"]["shell_exec"]
            llm_double.respond_with(reply_by_turn(tool_calls()))
            assert owner.post(f"/api/worlds/{world}/messages", json={"content": "hi"}).status_code == 201
            request = llm_double.wait_for_requests(1)[0]
            assert "shell_exec" not in {tool["function"]["name"] for tool in request.body.get("tools", [])}
    finally:
        process.stop()


def test_unsafe_no_sandbox_warns_once_and_runs_the_shell(tmp_path: Path, llm_double: OpenAIDouble) -> None:
    process = start_server(tmp_path / "data", llm=llm_double, args=["--no-demo", "--unsafe-no-sandbox"],
                           extra_env={"AGENT_WORLD_BWRAP": "/nonexistent"})
    try:
        warnings = [line for line in process.log().splitlines() if "unsandboxed" in line.lower()]
        assert len(warnings) == 1 and warnings[0].startswith("WARNING: --unsafe-no-sandbox"), warnings
        with client_for(process, process.token) as owner:
            world = make_world(owner, llm_double)
            assert "shell_exec" in {tool["name"] for tool in owner.get(f"/api/worlds/{world}").json()["tools"]}
            assert Lab(process, llm_double, owner, world).shell("echo ran")["output"] == "ran\n"
    finally:
        process.stop()


def test_the_data_folder_is_the_owners_only(secret_server: ServerProcess) -> None:
    data = secret_server.data_dir
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = [p for p in data.iterdir() if p.is_file()]
    assert any(p.name.startswith("agent-world.sqlite3") for p in files)
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


# --- the worlds' uids (a server running as root runs each world's tools as a user of its own) -----

CLAIM = """
import json, random, sys, threading, time
from pathlib import Path
from server.tools.sandbox import world_users
registry, seed, start_at, worlds = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
found = {}
def claim(order):
    for world in order:
        uid = world_users.claim_uid(registry, world, range(300_000, 300_400))
        assert found.setdefault(world, uid) == uid, (world, uid, found[world])
orders = [random.Random(seed * 10 + n).sample(worlds, len(worlds)) for n in range(4)]
threads = [threading.Thread(target=claim, args=(order,)) for order in orders]
time.sleep(max(0.0, start_at - time.time()))
for thread in threads: thread.start()
for thread in threads: thread.join()
print(json.dumps(found))
"""


def test_worlds_whose_ids_hash_alike_get_uids_of_their_own_until_the_range_is_used_up(tmp_path: Path) -> None:
    # Three uids for three worlds: their probes must meet, and each still gets one of its own.
    registry, uids = tmp_path / "registry", range(300_000, 300_003)
    got = [world_users.claim_uid(registry, world, uids) for world in ("one", "two", "three")]
    assert sorted(got) == list(uids), got
    claimed = [world_users.claim_uid(registry, world, uids) for world in ("three", "one", "two")]
    assert claimed == [got[2], got[0], got[1]]
    with pytest.raises(OSError, match="every sandbox uid from 300000 to 300002 is claimed"):
        world_users.claim_uid(registry, "four", uids)


def test_a_worlds_uid_is_claimed_next_to_the_workspaces_where_no_tool_looks(tmp_path: Path) -> None:
    workspaces = [tmp_path / "workspaces" / world for world in ("demo", "lab")]
    got = [world_users.sandbox_uid(w) for w in workspaces]
    registry = tmp_path / "workspaces" / world_users.UID_REGISTRY
    assert {os.readlink(registry / str(uid)) for uid in got} == {"demo", "lab"}
    assert all(uid in world_users.world_uids() for uid in got) and len(set(got)) == 2
    assert not registry.stat().st_mode & 0o077


def test_one_world_id_in_two_data_folders_gets_two_uids(tmp_path: Path) -> None:
    # Two servers on one host (or a test suite's many) each have a world `lab`: had they one uid, a
    # fork bomb in one would take the other's process slots. Each data folder salts its probe.
    got = {world_users.sandbox_uid(tmp_path / data / "workspaces" / "lab") for data in ("staging", "production")}
    assert len(got) == 2, got


def test_a_worlds_uid_is_the_same_after_a_restart_and_in_another_process(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    workspaces = [tmp_path / "data" / "workspaces" / world for world in ("one", "two", "demo", "lab-1")]
    first = [world_users.sandbox_uid(w) for w in workspaces]
    assert len(set(first)) == len(first)
    monkeypatch.setattr(world_users, "_uids", {})  # a restart: nothing remembered but the registry
    assert [world_users.sandbox_uid(w) for w in reversed(workspaces)] == first[::-1]
    # Another replica on the same data folder, reaching it by another path (a link to it).
    (tmp_path / "volume").symlink_to(tmp_path / "data")
    script = ("import sys; from pathlib import Path; from server.tools.sandbox import world_users\n"
              "print([world_users.sandbox_uid(Path(p)) for p in sys.argv[1:]])")
    paths = [str(tmp_path / "volume" / "workspaces" / w.name) for w in workspaces]
    other = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True, timeout=60,
                           cwd=Path(__file__).parents[2], env={**os.environ, world_users.UIDS_ENV: ""})
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == str(first)


def test_worlds_claimed_at_once_by_several_processes_and_threads_get_distinct_uids(tmp_path: Path) -> None:
    # 300 worlds in 400 uids: crc32 slots collide often, and probes run into each other's claims.
    worlds = [f"world-{n}" for n in range(300)]
    start_at = time.time() + 1.5  # every process starts claiming at this moment
    runs = [subprocess.Popen([sys.executable, "-c", CLAIM, str(tmp_path / "registry"), str(seed), str(start_at),
                              *worlds], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=Path(__file__).parents[2]) for seed in range(3)]
    found = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        found.append(json.loads(out))
    assert found[0] == found[1] == found[2]  # every process and thread agrees on every world's uid
    assert len(set(found[0].values())) == len(worlds)  # and no two worlds share one
    claims = {int(entry.name): os.readlink(entry) for entry in (tmp_path / "registry").iterdir()
              if entry.name != "salt"}
    assert claims == {uid: world for world, uid in found[0].items()}  # one claim a world, no stray ones


@pytest.mark.parametrize(("value", "says"), [
    ("lots", "is not a range: write START-END"),
    ("300000", "is not a range"),
    ("1000-999999", "START must be above 65535"),
    ("65535-999999", "START must be above 65535"),
    ("300000-2147483647", "END must be below 2147483647"),
    ("300000-300998", "at least 1000 uids"),
    ("300000-200000", "at least 1000 uids"),
])
def test_a_uid_range_that_cannot_be_given_to_worlds_is_refused_clearly(value: str, says: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        world_users.parse_world_uids(value)
    assert str(refused.value).startswith(f"{world_users.UIDS_ENV}={value!r}")
    monkeypatch.setenv(world_users.UIDS_ENV, value)
    monkeypatch.setattr(world_users, "_world_uids", None)
    with pytest.raises(ValueError, match=says):
        world_users.world_uids()
    if os.geteuid() == 0:  # the only case where it matters: tools are then off, and say why
        probed = sandbox.probe()
        assert not probed.available and says in probed.reason, probed


def test_a_uid_range_is_start_to_end_both_included(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert world_users.parse_world_uids("300000-300999") == range(300_000, 301_000)
    assert world_users.parse_world_uids(" 70000 - 2147483646 ") == range(70_000, 2**31 - 1)
    monkeypatch.setenv(world_users.UIDS_ENV, "400000-400999")
    monkeypatch.setattr(world_users, "_world_uids", None)
    monkeypatch.setattr(world_users, "_uids", {})
    assert 400_000 <= world_users.sandbox_uid(tmp_path / "workspaces" / "w") <= 400_999
    monkeypatch.setenv(world_users.UIDS_ENV, "")
    monkeypatch.setattr(world_users, "_world_uids", None)
    assert world_users.world_uids() == world_users.DEFAULT_WORLD_UIDS == range(200_000, 1_000_000)
