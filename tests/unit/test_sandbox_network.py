"""A sandbox that keeps the network (a world's `sandbox_network`) has a network of its own (netns.py):
it reaches the internet, never the host's loopback or networks, leaves nothing running, and where
slirp4netns is missing the tool says so instead of falling back to the host's network."""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from server.tools.base import ToolContext, ToolError
from server.tools.builtin import shell_tool
from server.tools.sandbox import bubblewrap as sandbox
from server.tools.sandbox import warm
from tests.fixtures.eventually import eventually, eventually_async
from tests.fixtures.processes import running

pytestmark = pytest.mark.skipif(not sandbox.status().sandboxed, reason="needs bubblewrap")
REGISTRY = ("pypi.org", 443)  # these machines reach the package registries and nothing else outside
SYSTEM_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def slirps() -> set[int]:
    """Pids of the slirp4netns processes running now."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "slirp4netns":
                found.add(int(pid))
        except OSError:
            continue
    return found


async def shell(ctx: ToolContext, command: str, *, network: bool = True) -> dict[str, Any]:
    tool = shell_tool(network=network)
    assert tool.run is not None
    result: dict[str, Any] = json.loads(await tool.run({"command": command, "timeout": 20}, ctx))
    return result


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(world="w", agent="a", chat="c", workspace=tmp_path / "workspace")


@pytest.fixture
def no_slirp4netns() -> Iterator[sandbox.Status]:
    """This process's sandbox as on a machine without slirp4netns (a path that does not exist)."""
    os.environ[sandbox.SLIRP_ENV] = "/nonexistent/slirp4netns"
    try:
        yield sandbox.configure()
    finally:
        del os.environ[sandbox.SLIRP_ENV]
        sandbox.configure()  # as the other tests expect it: probed with this machine's helpers


async def test_a_sandbox_with_the_network_reaches_the_internet_through_a_resolver_of_its_own(
        ctx: ToolContext) -> None:
    # The suite installs its packages from this registry, so it is reachable wherever the suite runs:
    # a host that cannot reach it is a broken set-up, said clearly, never a skip.
    try:
        socket.create_connection(REGISTRY, 5).close()
    except OSError as exc:
        pytest.fail(f"this host itself cannot reach {REGISTRY} ({exc}): nothing to compare the sandbox with")
    host, port = REGISTRY
    reached = await shell(ctx, f"cat /etc/resolv.conf; python3 -c \"import socket; "
                               f"print('CONNECTED', socket.create_connection(('{host}', {port}), 10).getpeername())\"")
    assert reached["exit_code"] == 0, reached
    assert reached["output"].startswith("nameserver 10.0.2.3\n") and "CONNECTED" in reached["output"], reached


async def test_the_routes_that_fence_a_sandbox_are_beyond_its_reach(ctx: ToolContext) -> None:
    changed = await shell(ctx, "ip route del prohibit 10.0.0.0/8; ip route flush table main; "
                               "ip route | grep -c prohibit")
    assert changed["exit_code"] == 0, changed
    assert "Operation not permitted" in changed["output"], changed
    assert int(changed["output"].split()[-1]) >= 6, changed  # every fence still stands


async def test_a_networked_sandbox_leaves_nothing_running(ctx: ToolContext) -> None:
    before = slirps()
    done = await shell(ctx, "echo ran")
    assert done["output"] == "ran\n", done
    warm.start()
    try:
        await shell(ctx, "true")
        await eventually_async(lambda: slirps() - before, what="the next warm sandbox's network")
    finally:
        await warm.stop()
    # slirp4netns exits once its sandbox's launcher is gone.
    await eventually_async(lambda: not slirps() - before, what="no slirp4netns left")


def test_a_networked_sandbox_starts_every_time() -> None:
    # slirp4netns --configure brought lo up while bwrap set it up: about 1 start in 10 failed
    # ("bwrap: loopback: Failed RTM_NEWADDR"), and when the probe met it, networked tools were off for good.
    argv = sandbox.wrap(["true"], workspace=None, network=True)
    runs = [subprocess.run(argv, env=SYSTEM_ENV, stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
            for _ in range(40)]
    failed = [run.stderr for run in runs if run.returncode != 0]
    assert not failed, failed[:3]


def test_a_networked_sandbox_ends_with_the_server() -> None:
    """A killed server (SIGKILL, the OOM killer) leaves no command running with the network."""
    marker = f"{secrets.randbelow(10**6) + 10**6}.5"  # a sleep no other process runs
    server = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, time; from server.tools.sandbox import bubblewrap as sandbox; "
                               f"subprocess.Popen(sandbox.wrap(['sleep', '{marker}'], workspace=None, network=True), "
                               f"env={SYSTEM_ENV!r}); time.sleep(60)"])
    try:
        eventually(lambda: running(["sleep", marker], exactly=True), what="the command running in its sandbox")
    finally:
        server.kill()
        server.wait()
    eventually(lambda: not running(["sleep", marker]), what="the sandbox and its launcher gone with the server")


async def test_without_slirp4netns_a_world_that_allows_the_network_is_told_why_and_nothing_runs(
        ctx: ToolContext, no_slirp4netns: sandbox.Status) -> None:
    status = no_slirp4netns
    assert status.sandboxed and not status.network
    assert "slirp4netns not found" in status.startup_line()
    assert "slirp4netns" in sandbox.tool_errors(network="open")["shell_exec"]
    assert sandbox.tool_errors(network="off") == {}
    with pytest.raises(ToolError, match="cannot give a sandbox a network of its own"):
        await shell(ctx, "touch ran")
    assert not (ctx.workspace / "ran").exists()
    offline = await shell(ctx, "echo offline", network=False)  # a world without the network is unaffected
    assert offline["output"] == "offline\n", offline


def test_when_slirp4netns_fails_the_owner_is_told_what_it_said(tmp_path: Path) -> None:
    # In a container without /dev/net/tun, slirp4netns says so on stderr and exits: that line is the
    # reason (the startup line's, `tool_errors`'), not a bare exit status.
    failing = tmp_path / "slirp4netns"
    failing.write_text('#!/bin/sh\necho \'open("/dev/net/tun"): No such file or directory\' >&2\nexit 1\n')
    failing.chmod(0o755)
    os.environ[sandbox.SLIRP_ENV] = str(failing)
    try:
        status = sandbox.probe()
    finally:
        del os.environ[sandbox.SLIRP_ENV]
    assert status.sandboxed and not status.network
    assert "/dev/net/tun" in status.network_reason, status.network_reason


def _broken(tmp_path: Path, helper: str, script: str) -> sandbox.Status:
    """This machine's sandbox status with `helper` (slirp4netns, nsenter or ip) replaced by `script`."""
    fake = tmp_path / helper
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    helpers = dict(zip(sandbox.NETWORK_HELPERS, sandbox.status().network, strict=True))
    return replace(sandbox.status(), network=tuple({**helpers, helper: str(fake)}.values()))


def _marked(tmp_path: Path) -> tuple[Path, str, list[str]]:
    """A workspace, and a command that leaves a file there then sleeps for a time no other process does."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    workspace.chmod(0o777)  # (the sandbox user writes it)
    marker = f"{secrets.randbelow(10**6) + 10**6}.5"
    return workspace, marker, ["sh", "-c", f"touch ran; exec sleep {marker}"]


@pytest.mark.parametrize("failing", ["slirp4netns", "ip"])
def test_a_sandbox_whose_network_cannot_be_set_up_never_runs_its_command(tmp_path: Path, failing: str) -> None:
    # bwrap's --block-fd took the launcher's exit (end of file) as the go, and the sandbox's first process
    # outlived a killed bwrap: the command ran after all, unfenced and out of reach, while the tool failed.
    broken = _broken(tmp_path, failing, '[ "$1" = -json ] && exec ip "$@"\necho failed >&2\nexit 1\n')
    workspace, marker, command = _marked(tmp_path)
    argv = sandbox.wrap(command, workspace=workspace, network=True, current=broken)
    done = subprocess.run(argv, env=SYSTEM_ENV, stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
    assert done.returncode == 126 and b"sandbox network:" in done.stderr, done
    time.sleep(1)  # (a command released by the launcher's exit has run by now)
    assert not (workspace / "ran").exists()
    assert not running(["sleep", marker], exactly=True)


def test_a_launcher_killed_while_it_fences_the_network_never_lets_the_command_run(tmp_path: Path) -> None:
    # A slirp4netns that never says it is ready, and ends when the launcher does (as the real one, by --exit-fd).
    waits = 'for a; do case $a in --exit-fd=*) fd=${a#--exit-fd=};; esac; done\neval "read -r x <&$fd"\nexit 1\n'
    broken = _broken(tmp_path, "slirp4netns", waits)
    workspace, marker, command = _marked(tmp_path)
    launcher = subprocess.Popen(sandbox.wrap(command, workspace=workspace, network=True, current=broken),
                                env=SYSTEM_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        eventually(lambda: running([str(tmp_path / "slirp4netns"), "tap0"]), what="the launcher waiting on it")
    finally:
        launcher.kill()  # SIGKILL: no handler runs, the kernel closes its pipes
        launcher.wait()
    time.sleep(1)  # (a command released by the launcher's death has run by now)
    assert not (workspace / "ran").exists()
    assert not running(["sleep", marker], exactly=True)
    eventually(lambda: not running([str(tmp_path / "slirp4netns"), "tap0"]), what="the fake slirp4netns gone")
