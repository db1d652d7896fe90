"""A sandbox that keeps the network (a world's `sandbox_network`) has a network of its own (netns.py):
it reaches the internet, never the host's loopback or networks, leaves nothing running, and where
slirp4netns is missing the tool says so instead of falling back to the host's network."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from server.tools import sandbox, warm
from server.tools.base import ToolContext, ToolError
from server.tools.builtin import shell_tool
from tests.fixtures.eventually import eventually_async

pytestmark = pytest.mark.skipif(not sandbox.status().sandboxed, reason="needs bubblewrap")
REGISTRY = ("pypi.org", 443)  # these machines reach the package registries and nothing else outside


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
def reset_sandbox() -> Any:
    yield
    sandbox.configure()  # as the other tests expect it: probed with this machine's helpers


async def test_a_sandbox_with_the_network_reaches_the_internet_through_a_resolver_of_its_own(
        ctx: ToolContext) -> None:
    try:
        socket.create_connection(REGISTRY, 5).close()
    except OSError as exc:
        pytest.skip(f"this host itself cannot reach {REGISTRY}: {exc}")
    host, port = REGISTRY
    reached = await shell(ctx, f"cat /etc/resolv.conf; python3 -c \"import socket; "
                               f"print('CONNECTED', socket.create_connection(('{host}', {port}), 10).getpeername())\"")
    assert reached["exit_code"] == 0, reached
    assert reached["output"].startswith("nameserver 10.0.2.3\n") and "CONNECTED" in reached["output"], reached


async def test_the_routes_that_fence_a_sandbox_are_beyond_its_reach(ctx: ToolContext) -> None:
    changed = await shell(ctx, "ip route del prohibit 10.0.0.0/8; ip route flush table main; ip route | grep -c prohibit")
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
    """slirp4netns --configure brought lo up while bwrap set it up: ~1 start in 10 failed ("bwrap:
    loopback: Failed RTM_NEWADDR"), and when the probe met it, networked tools were off for good."""
    import subprocess
    argv = sandbox.wrap(["true"], workspace=None, network=True)
    failed = [done.stderr for done in (subprocess.run(argv, env={"PATH": sandbox._SYSTEM_PATH}, stdin=subprocess.DEVNULL,
                                                      capture_output=True, timeout=20) for _ in range(40))
              if done.returncode != 0]
    assert not failed, failed[:3]


def test_a_networked_sandbox_ends_with_the_server() -> None:
    """A killed server (SIGKILL, OOM) must not leave a command running with the network."""
    import signal
    import subprocess
    import sys
    import time
    argv = sandbox.wrap(["sleep", "60"], workspace=None, network=True)
    server = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               f"p = subprocess.Popen({argv!r}, env={{'PATH': {sandbox._SYSTEM_PATH!r}}}); "
                               "print(p.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert server.stdout is not None
    launcher = int(server.stdout.readline())
    time.sleep(1)
    server.send_signal(signal.SIGKILL)
    server.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{launcher}").exists() \
            and "Z" not in Path(f"/proc/{launcher}/stat").read_text().split()[2]:
        time.sleep(0.05)
    alive = Path(f"/proc/{launcher}").exists() and "Z" not in Path(f"/proc/{launcher}/stat").read_text().split()[2]
    if alive:
        os.kill(launcher, signal.SIGKILL)
    assert not alive, "the sandbox outlived the server"


async def test_without_slirp4netns_a_world_that_allows_the_network_is_told_why_and_nothing_runs(
        ctx: ToolContext, monkeypatch: pytest.MonkeyPatch, reset_sandbox: None) -> None:
    monkeypatch.setenv(sandbox.SLIRP_ENV, "/nonexistent/slirp4netns")
    status = sandbox.configure()
    assert status.sandboxed and not status.network
    assert "slirp4netns not found" in status.startup_line()
    assert "slirp4netns" in sandbox.tool_errors(network=True)["shell_exec"]
    assert sandbox.tool_errors(network=False) == {}
    with pytest.raises(ToolError, match="cannot give a sandbox a network of its own"):
        await shell(ctx, "touch ran")
    assert not (ctx.workspace / "ran").exists()
    offline = await shell(ctx, "echo offline", network=False)  # a world without the network is unaffected
    assert offline["output"] == "offline\n", offline

