"""Pre-started ("warm") shell sandboxes, so that starting bubblewrap is off an approval's critical path.

Setting up a sandbox (namespaces, mounts, a network namespace) takes 5-50 ms, most of an approved
`shell_exec("true")`. Each shell command runs in a sandbox of its own, built exactly as a cold one
(`sandbox.wrap`), whose first process is a tiny shim: it reads one command from its stdin, lowers
its CPU limit to the call's timeout, and runs it with stdin from /dev/null. So a warm
sandbox runs exactly one command; once it is taken, a fresh one is started in the background for
the workspace's next command.

A warm sandbox is used only if it was built for the same workspace directory (device and inode:
not a deleted and recreated one), the same network setting, the same environment and the same
sandbox configuration; any other is killed instead. Pools exist only between `start()` and
`stop()` (the server's lifespan, on its event loop), which kills every idle sandbox: nothing is left
behind. Elsewhere (tools called directly) every command gets a cold sandbox through the same shim.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from . import bubblewrap as sandbox
from .output import ToolProcess, start_process

# The first line is the timeout, the rest the command, read line by line with builtins only (a
# `$(cat)` would fork and exec: 3 ms); the last line may lack its newline. The command runs in this
# shell by `eval`, as `sh -c` would run it (no positional parameters, none of the shim's variables):
# an `exec /bin/sh -c` instead cost 1 ms of every command here, loading a second shell.
SHIM = ('read -r t || exit 125; c=; while IFS= read -r l; do c="$c$l\n"; done; '
        'ulimit -t "$t" || exit 125; exec </dev/null; set -- "$c$l"; unset t c l; eval "shift; $1"')
MAX_IDLE = 16  # idle warm sandboxes per server (each holds a few sleeping processes)
# Seconds between a command's end and the start of the workspace's next sandbox. Starting one holds
# the event loop for 1-10 ms (bwrap's argv, then fork and exec), which right away fell on the
# command's result and the agent's next LLM request; by then those are out. The next command comes
# after an LLM call at the earliest; one that comes sooner starts cold, as without a pool.
REFILL_DELAY = 0.01
Key = tuple[object, ...]


@dataclass
class _Pool:
    users: int = 0
    idle: dict[Path, tuple[Key, ToolProcess]] = field(default_factory=dict)
    filling: dict[Path, asyncio.Task[None]] = field(default_factory=dict)


_pools: dict[asyncio.AbstractEventLoop, _Pool] = {}


def start() -> None:
    """Keep warm sandboxes on this event loop until the matching `stop()`."""
    pool = _pools.setdefault(asyncio.get_running_loop(), _Pool())
    pool.users += 1


async def stop() -> None:
    """Kill this loop's idle sandboxes (and those being started) once its last user stops."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        return
    pool.users -= 1
    if pool.users > 0:
        return
    del _pools[loop]
    # Not cancelled: a launch cut short after its fork would leave a sandbox nobody knows of.
    await asyncio.gather(*pool.filling.values(), return_exceptions=True)
    await asyncio.gather(*(_discard(proc) for _, proc in pool.idle.values()))
    pool.idle.clear()


def _key(workspace: Path, network: bool, env: dict[str, str]) -> Key:
    info = os.stat(workspace)
    return (info.st_dev, info.st_ino, network, tuple(sorted(env.items())), sandbox.generation())


async def _launch(workspace: Path, network: bool, env: dict[str, str], proxy: Path | None = None) -> ToolProcess:
    # CPU: SHELL_LIMITS' (the largest timeout); the shim lowers it to the call's own, which needs no privilege.
    argv = sandbox.wrap(["/bin/sh", "-c", SHIM], workspace=workspace, network=network, limits=sandbox.SHELL_LIMITS,
                        proxy=proxy)
    return await start_process(
        *argv, cwd=workspace, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True)


def kill_group(proc: asyncio.subprocess.Process) -> None:
    # Its own session, so its pid is the group id of everything it started.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def forget(proc: asyncio.subprocess.Process) -> None:
    """Stop reading the output of a process that exited while something still holds its pipe (a sandbox's
    first process, a few ms longer while the kernel takes its namespaces down; or a child that left its
    group). asyncio's Process has no close of its own: its transport's closes the pipes (it kills only a
    process still running)."""
    proc._transport.close()  # type: ignore[attr-defined]


async def _discard(proc: ToolProcess) -> None:
    kill_group(proc)  # bwrap's death takes its whole PID namespace along
    if proc.stdin is not None:
        proc.stdin.close()
    with contextlib.suppress(TimeoutError):  # reaped, its pipes closed (bounded: never hang a shutdown)
        async with asyncio.timeout(5):
            await proc.wait()


async def _fill(pool: _Pool, workspace: Path, key: Key, network: bool, env: dict[str, str]) -> None:
    await asyncio.sleep(REFILL_DELAY)
    if _pools.get(asyncio.get_running_loop()) is not pool:  # stopped meanwhile: nothing to start
        return
    try:
        proc = await _launch(workspace, network, env)
    except OSError:  # the next command starts cold, and says why if it fails too
        return
    if _pools.get(asyncio.get_running_loop()) is not pool:  # stopped meanwhile
        await _discard(proc)
        return
    unwanted = [entry for entry in [pool.idle.pop(workspace, None)] if entry]  # one per workspace
    pool.idle[workspace] = (key, proc)
    if len(pool.idle) > MAX_IDLE:
        unwanted.append(pool.idle.pop(next(iter(pool.idle))))
    for _, old in unwanted:
        await _discard(old)


async def spawn(workspace: Path, command: str, *, timeout: int, network: bool,
                env: dict[str, str], proxy: Path | None = None) -> ToolProcess:
    """A sandbox running `command` (already sent to it) in `workspace`: a warm one when there is one
    that fits, else a cold one. `timeout` is the CPU limit in seconds. Raises OSError. `proxy` (a
    call's proxy folder, the `ask` network mode) is one call's: always a cold sandbox."""
    if proxy is not None:
        alone = await _launch(workspace, network, env, proxy)
        await _send(alone, command, timeout)
        return alone
    pool = _pools.get(asyncio.get_running_loop())
    key = _key(workspace, network, env)
    proc: ToolProcess | None = None
    if pool is not None and (entry := pool.idle.pop(workspace, None)) is not None:
        if entry[0] == key and entry[1].returncode is None:
            proc = entry[1]
        else:  # the world's settings or workspace changed, or it died: never used
            await _discard(entry[1])
    if proc is None or not await _send(proc, command, timeout):
        if proc is not None:  # it died before taking the command: run it cold
            await _discard(proc)
        proc = await _launch(workspace, network, env)
        await _send(proc, command, timeout)  # if bwrap failed, its output says why
    return proc


def refill(workspace: Path, *, network: bool, env: dict[str, str]) -> None:
    """Start the workspace's next sandbox in the background, `REFILL_DELAY` after its last command is
    over (building one beside a running one slows both, through the kernel's namespace locks)."""
    pool = _pools.get(asyncio.get_running_loop())
    if pool is None or workspace in pool.filling:
        return
    try:
        key = _key(workspace, network, env)
    except OSError:  # the workspace is gone (its world was deleted)
        return
    task = asyncio.create_task(_fill(pool, workspace, key, network, env))
    pool.filling[workspace] = task
    task.add_done_callback(lambda _: pool.filling.pop(workspace) if pool.filling.get(workspace) is task else None)


async def _send(proc: ToolProcess, command: str, timeout: int) -> bool:
    """Whether the shim took the command."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(f"{timeout}\n{command}".encode())
        await proc.stdin.drain()
        proc.stdin.close()
        return True
    except (BrokenPipeError, ConnectionResetError):
        proc.stdin.close()
        return False
    except BaseException:  # cancelled: the caller never gets it, so nobody else would kill it
        kill_group(proc)
        raise
