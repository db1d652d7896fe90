"""Tool processes (the shell, MCP stdio servers) run inside a bubblewrap sandbox.

A sandboxed process gets new PID, IPC, UTS, cgroup and network namespaces (where the world allows
the network, a network of its own that reaches the internet and nothing of the host's: netns.py);
a fresh /proc, so no server process is visible; a seccomp filter that refuses the system calls tools
never need (new user namespaces, ptrace, mounts, bpf, keyctl, …: seccomp.py); the system directories
and the server's Python installation read-only; a private /tmp; one writable folder, the world's
workspace; an environment built from nothing (by the caller); and resource limits. It never gets
the data folder, the server's home or another world's workspace: they are not mounted at all (or
covered by an empty tmpfs where they lie under a mounted directory).

Whether the sandbox works is decided once per process (`configure` at start, else on first use);
where it cannot work, tools that need it are off unless the owner ran `--unsafe-no-sandbox`. Where
only the networked sandbox cannot work (no slirp4netns), tools that would need it say so instead.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ... import trip_files
from ..egress import proxy as egress
from . import seccomp, world_users

BWRAP_ENV = "AGENT_WORLD_BWRAP"  # the bwrap to use; a path that does not exist simulates "no sandbox"
SLIRP_ENV = "AGENT_WORLD_SLIRP4NETNS"  # the same for slirp4netns: "no network for a sandbox"
NETNS_SCRIPT = str(Path(__file__).with_name("netns.py"))
FORWARDER = Path(egress.__file__).with_name("forwarder.py").read_text()  # run inside, as source: `proxy`
NETWORK_HELPERS = ("slirp4netns", "nsenter", "ip")  # what netns.py runs (slirp4netns, util-linux, iproute2)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
SECCOMP_FD = 9  # the descriptor bwrap reads the filter from (one digit: sh's redirections)
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Limits:
    """Per-process resource limits inside the sandbox (None: no limit)."""

    cpu_seconds: int | None = 120
    memory_bytes: int = 2 << 30  # address space of each process
    processes: int = 256  # processes of the sandbox user (per sandbox, or per world host-wide when the server is root)
    file_bytes: int = 1 << 30  # the largest file a process may write
    open_files: int = 1024
    tmp_bytes: int = 256 << 20  # the private /tmp lives in memory
    niceness: int = 10


SHELL_LIMITS = Limits()
SERVER_LIMITS = Limits(cpu_seconds=None)  # an MCP server lives as long as its world


@dataclass(frozen=True)
class Status:
    available: bool
    reason: str = ""  # why not, when not available
    unsafe: bool = False  # --unsafe-no-sandbox: tools run unsandboxed
    bwrap: str = ""
    network: tuple[str, ...] = ()  # NETWORK_HELPERS' paths, when a sandbox can have a network
    network_reason: str = ""  # why it cannot, when it cannot

    @property
    def sandboxed(self) -> bool:
        return self.available and not self.unsafe

    @property
    def tools_allowed(self) -> bool:
        """Whether tools that need the sandbox may run at all (sandboxed or, by choice, not)."""
        return self.available or self.unsafe

    def refusal(self) -> str:
        return (f"the tool sandbox is unavailable ({self.reason}); the server's owner can install "
                "bubblewrap or start it with --unsafe-no-sandbox")

    def network_refusal(self) -> str:
        """Why a sandbox that keeps the network cannot start ("" when it can, or tools run unsandboxed)."""
        if not self.sandboxed or self.network:
            return ""
        advice = "install slirp4netns" if "not found" in self.network_reason else "see the reason in its log"
        return (f"the world allows the network, but this server cannot give a sandbox a network of its own "
                f"({self.network_reason}); the server's owner can {advice}")

    def ask_refusal(self) -> str:
        """Why a world whose connections wait for a person ("ask") cannot run tools ("" when it can): only the
        sandbox holds a command's connections at the proxy; unsandboxed, one would reach any host unasked."""
        if not self.unsafe:
            return ""
        return ('the world asks a person about each connection (sandbox_network "ask"), which only the tool '
                "sandbox can hold a command to; this server runs tools unsandboxed (--unsafe-no-sandbox)")

    def startup_line(self) -> str:
        if self.unsafe:
            return ("WARNING: --unsafe-no-sandbox: shell commands and MCP servers run UNSANDBOXED with this "
                    "server's rights: an approved command can read its data, tokens and API keys")
        if self.available:
            network = ("worlds that allow the network give it a network of its own (slirp4netns)" if self.network
                       else f"worlds that allow the network cannot run tools ({self.network_reason})")
            return (f"Tool sandbox: bubblewrap works ({self.bwrap}): the shell and MCP servers run without "
                    f"network, server files or secrets, and a seccomp filter; {network}")
        return (f"Tool sandbox unavailable ({self.reason}): shell tools are off and untrusted MCP servers "
                "do not start (--unsafe-no-sandbox runs them unsandboxed)")


_status: Status | None = None
_hidden: tuple[Path, ...] = ()
_generation = 0  # counts configurations: a sandbox built under an earlier one is never reused


def generation() -> int:
    return _generation


def configure(*, unsafe: bool = False, hidden: Sequence[Path] = ()) -> Status:
    """Probe the sandbox for this process; `hidden` (the data folder) is never shown to a tool, nor is the
    memory where work for the worker processes travels, secrets included (trip_files.MEMORY).
    `AGENT_WORLD_SANDBOX_UIDS` is read again (the probe fails when it is not a valid range)."""
    global _status, _hidden, _generation
    world_users.forget()
    _hidden = tuple(Path(p).resolve() for p in (*hidden, trip_files.MEMORY))
    _generation += 1
    _status = replace(probe(), unsafe=unsafe)
    return _status


def status() -> Status:
    """This process's sandbox status (probed on first use when `configure` was not called)."""
    global _status
    if _status is None:
        _status = probe()  # once per process, a few milliseconds
    return _status


def tool_errors(*, network: str = "off") -> dict[str, str]:
    """What `GET /api/worlds/{w}` says about tools that are off because of the sandbox (`network`: the
    world's mode, egress/hosts.py `network_mode`: off, open or ask)."""
    current = status()
    if not current.tools_allowed:
        return {"shell_exec": current.refusal()}
    refusal = {"open": current.network_refusal, "ask": current.ask_refusal}.get(network, str)()
    return {"shell_exec": refusal} if refusal else {}


def probe() -> Status:
    """Run `true` in the sandbox as tools would run; the first line of any failure is the reason."""
    bwrap = os.environ.get(BWRAP_ENV) or shutil.which("bwrap") or ""
    if not bwrap or not os.access(bwrap, os.X_OK):
        return Status(False, f"bubblewrap not found{': ' + bwrap if bwrap else ''}")
    if os.geteuid() == 0:
        try:
            world_users.world_uids()
        except ValueError as exc:
            return Status(False, str(exc))
    helpers = ["prlimit"] + (["setpriv"] if os.geteuid() == 0 else [])
    missing = [name for name in helpers if not shutil.which(name, path=_SYSTEM_PATH)]
    if missing:
        return Status(False, f"{' and '.join(missing)} (util-linux) not found")
    try:
        seccomp.program()
    except ValueError as exc:  # never a sandbox without its filter
        return Status(False, str(exc))
    available = Status(True, bwrap=bwrap)
    failure = _failure(wrap(["true"], workspace=None, current=available))
    if failure:
        return Status(False, failure)
    found = {name: shutil.which(name, path=_SYSTEM_PATH) for name in NETWORK_HELPERS}
    if os.environ.get(SLIRP_ENV):
        found["slirp4netns"] = shutil.which(os.environ[SLIRP_ENV])
    if missing := [name for name, path in found.items() if not path]:
        return replace(available, network_reason=f"{' and '.join(missing)} not found")
    networked = replace(available, network=tuple(str(path) for path in found.values()))
    failure = _failure(wrap(["true"], workspace=None, network=True, current=networked))
    return replace(available, network_reason=failure) if failure else networked


def _failure(argv: list[str]) -> str:
    """Why `argv` (a sandbox running `true`) failed: the last line it printed ("" when it ran)."""
    try:
        done = subprocess.run(argv, env={"PATH": _SYSTEM_PATH}, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{Path(argv[0]).name} did not run: {exc}"
    if done.returncode == 0:
        return ""
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"{Path(argv[0]).name} exited with {done.returncode}"


def prepare_workspace(workspace: Path) -> None:
    """Give the world's sandbox user the workspace (blocking; call in a thread: the world's uid is
    claimed here on first use). A workspace of an earlier user (nobody's, before worlds had users
    of their own; or the uid its id hashes to, claimed first by another world) is given over entirely."""
    owner = file_owner(workspace)
    if owner is None:
        return
    top = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if os.fstat(top).st_uid == owner[0]:
            return
        world_users.give_tree(top, owner)
        os.fchown(top, *owner)  # last: the mark that the walk is done
    finally:
        os.close(top)


def file_owner(workspace: Path) -> tuple[int, int] | None:
    """Who must own what the server writes into `workspace` so that sandboxed tools can change it."""
    if os.geteuid() != 0 or not status().sandboxed:
        return None
    uid = world_users.sandbox_uid(workspace)
    return uid, uid


def wrap(argv: Sequence[str], *, workspace: Path | None, network: bool = False, limits: Limits = SHELL_LIMITS,
         read_only: Sequence[Path] = (), current: Status | None = None, proxy: Path | None = None) -> list[str]:
    """The command line that runs `argv` in the sandbox, in `workspace` (None: a private /tmp only).

    `proxy` (the `ask` network mode, without `network`): the folder of a call's proxy socket
    (egress/proxy.py), mounted read-only; a relay started before the command listens on the sandbox's
    own loopback and passes each connection to it. The sandbox has no other way out.

    `read_only` adds paths the command needs (an MCP server's script); none under the data folder.
    The caller runs it with an environment built from nothing: bwrap's own environment is readable
    from inside (/proc/1/environ), and its arguments by anyone on the host (no secrets there).
    """
    current = current or status()
    if network and not current.network:
        raise OSError(current.network_refusal() or "a sandbox cannot have a network here")
    root = os.geteuid() == 0
    # netns.py starts bwrap where the network is allowed: it gives the new namespace its network.
    # (It ends with this process, which must be the one that starts it.)
    launcher = [sys.executable, "-I", "-S", NETNS_SCRIPT, str(os.getpid()), *current.network] if network else []
    # bwrap reads the seccomp filter from SECCOMP_FD, which the launcher opens (seccomp.py).
    args = [*launcher, *seccomp.launcher(SECCOMP_FD), current.bwrap, "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--unshare-net", "--hostname", "sandbox", "--die-with-parent",
            "--new-session", "--seccomp", str(SECCOMP_FD)]
    mounts = _Mounts(args)
    for system in SYSTEM_DIRS:
        if os.path.isdir(system):
            mounts.ro_bind(Path(system))
    args += ["--proc", "/proc", "--dev", "/dev"]
    mounts.tmpfs(Path("/tmp"), perms="1777", size=limits.tmp_bytes)
    for hidden in (*_hidden, Path.home().resolve()):
        if mounts.shows(hidden):  # under a system directory: cover it with an empty one
            mounts.tmpfs(hidden)
    # The Python installation, so that `python3` and Python MCP servers work; it holds no secrets.
    home = Path.home().resolve()
    for path in dict.fromkeys(Path(p).resolve() for p in (Path(sys.prefix), Path(sys.base_prefix), *read_only)):
        inside_or_above_hidden = any(path.is_relative_to(h) or h.is_relative_to(path) for h in _hidden)
        if path.exists() and not inside_or_above_hidden and not home.is_relative_to(path):
            mounts.ro_bind(path)
    if workspace is not None:
        mounts.bind(Path(workspace).resolve())
    if proxy is not None:
        mounts.ro_bind_at(proxy, Path(egress.SOCKET_DIR))
        argv = [sys.executable, "-I", "-S", "-c", FORWARDER, f"{egress.SOCKET_DIR}/{egress.SOCKET_NAME}",
                str(egress.PORT), *argv]
    args += ["--chdir", str(Path(workspace).resolve()) if workspace is not None else "/tmp"]
    if root:
        uid = world_users.sandbox_uid(workspace)
        # Named inside (npm, git and ssh look the user up), by files that list only it and root.
        passwd, group = world_users.identity_files(uid)
        args += ["--ro-bind", passwd, "/etc/passwd", "--ro-bind", group, "/etc/group"]
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                 "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all"]
    args += ["--", "prlimit", f"--as={limits.memory_bytes}", f"--nproc={limits.processes}",
             f"--fsize={limits.file_bytes}", f"--nofile={limits.open_files}", "--core=0"]
    if limits.cpu_seconds is not None:
        args.append(f"--cpu={limits.cpu_seconds}")
    # Below the server's priority: a busy tool slows other tools, not the server's answers.
    return [*args, "--", "nice", "-n", str(limits.niceness), *argv]


class _Mounts:
    """bwrap mount arguments, tracking what is mounted where. Directories bwrap creates on the way
    get mode 0755 (its default is 0700), so the unprivileged sandbox user can walk to its mounts."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.roots: dict[Path, str] = {}  # mount point -> "ro" | "rw" | "tmpfs"
        self.made: set[Path] = set()

    def kind(self, path: Path) -> str | None:
        """The kind of the deepest mount that holds `path` (None: the sandbox's empty root)."""
        holders = [root for root in self.roots if path.is_relative_to(root)]
        return self.roots[max(holders, key=lambda r: len(r.parts))] if holders else None

    def shows(self, path: Path) -> bool:
        """Whether `path` would be visible from the host through a read-only bind."""
        return self.kind(path) == "ro"

    def _parents(self, path: Path) -> None:
        for parent in reversed(path.parents):
            if parent == Path("/") or parent in self.made or parent in self.roots or self.kind(parent) == "ro":
                continue  # the root, made already, a mount point, or present in a read-only mount
            self.args += ["--perms", "0755", "--dir", str(parent)]
            self.made.add(parent)

    def _mount(self, option: str, path: Path, kind: str) -> None:
        self._parents(path)
        self.args += [option, str(path), str(path)]
        self.roots[path] = kind

    def ro_bind(self, path: Path) -> None:
        if not self.shows(path):  # else visible already, through a read-only parent
            self._mount("--ro-bind", path, "ro")

    def ro_bind_at(self, source: Path, target: Path) -> None:
        self._parents(target)
        self.args += ["--ro-bind", str(source), str(target)]
        self.roots[target] = "ro"

    def bind(self, path: Path) -> None:
        self._mount("--bind", path, "rw")

    def tmpfs(self, path: Path, *, perms: str = "0755", size: int | None = None) -> None:
        self._parents(path)
        self.args += ["--perms", perms] + (["--size", str(size)] if size else []) + ["--tmpfs", str(path)]
        self.roots[path] = "tmpfs"
