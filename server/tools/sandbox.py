"""Tool processes (the shell, MCP stdio servers) run inside a bubblewrap sandbox.

A sandboxed process gets new PID, IPC, UTS, cgroup and network namespaces (where the world allows
the network, a network of its own that reaches the internet and nothing of the host's: netns.py);
a fresh /proc, so no server process is visible; the system directories and the server's Python
installation read-only; a private /tmp; one writable folder, the world's workspace; an environment
built from nothing (by the caller); and resource limits. It never gets the data folder, the server's
home or another world's workspace: they are not mounted at all (or covered by an empty tmpfs where
they lie under a mounted directory).

Whether the sandbox works is decided once per process (`configure` at start, else on first use);
where it cannot work, tools that need it are off unless the owner ran `--unsafe-no-sandbox`. Where
only the networked sandbox cannot work (no slirp4netns), tools that would need it say so instead.
"""
from __future__ import annotations

import atexit
import errno
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

BWRAP_ENV = "AGENT_WORLD_BWRAP"  # the bwrap to use; a path that does not exist simulates "no sandbox"
SLIRP_ENV = "AGENT_WORLD_SLIRP4NETNS"  # the same for slirp4netns: "no network for a sandbox"
# A server running as root runs tools as a user of their world's own (the kernel never applies the
# process-count limit to root, and root owns the files a tool must not touch): the limit counts
# the processes of a user, so one world's fork bomb must not take another world's process slots.
SANDBOX_UID = 65534  # nobody: a sandbox with no workspace (an MCP server with a private /tmp)
# The uids worlds' users are claimed from: AGENT_WORLD_SANDBOX_UIDS=START-END, both included. The
# default lies above login users and has no names, but it may overlap the host's subordinate ids
# (/etc/subuid: rootless containers) or SSSD's id mapping (from 200,000 by default): such a user
# would share a world's process limit, so an owner whose host uses them picks a free range.
UIDS_ENV = "AGENT_WORLD_SANDBOX_UIDS"
DEFAULT_WORLD_UIDS = range(200_000, 1_000_000)
MIN_WORLD_UIDS = 1000  # one per world ever made (a uid is never reused)
# Which world holds which uid: a folder next to the workspaces (data/workspaces/.sandbox-uids), one
# symbolic link a uid, named by it and pointing at the world id. A world id never starts with a dot,
# so no world's workspace is this folder, and a sandbox mounts only its own world's workspace.
UID_REGISTRY = ".sandbox-uids"
NETNS_SCRIPT = str(Path(__file__).with_name("netns.py"))
NETWORK_HELPERS = ("slirp4netns", "nsenter", "ip")  # what netns.py runs (slirp4netns, util-linux, iproute2)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
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

    def startup_line(self) -> str:
        if self.unsafe:
            return ("WARNING: --unsafe-no-sandbox: shell commands and MCP servers run UNSANDBOXED with this "
                    "server's rights: an approved command can read its data, tokens and API keys")
        if self.available:
            network = ("worlds that allow the network give it a network of its own (slirp4netns)" if self.network
                       else f"worlds that allow the network cannot run tools ({self.network_reason})")
            return (f"Tool sandbox: bubblewrap works ({self.bwrap}): the shell and MCP servers run without "
                    f"network, server files or secrets; {network}")
        return (f"Tool sandbox unavailable ({self.reason}): shell tools are off and untrusted MCP servers "
                "do not start (--unsafe-no-sandbox runs them unsandboxed)")


_status: Status | None = None
_hidden: tuple[Path, ...] = ()
_generation = 0  # counts configurations: a sandbox built under an earlier one is never reused


def generation() -> int:
    return _generation


def configure(*, unsafe: bool = False, hidden: Sequence[Path] = ()) -> Status:
    """Probe the sandbox for this process; `hidden` (the data folder) is never shown to a tool.
    `AGENT_WORLD_SANDBOX_UIDS` is read again (the probe fails when it is not a valid range)."""
    global _status, _hidden, _generation, _world_uids
    _world_uids = None
    _uids.clear()
    _hidden = tuple(Path(p).resolve() for p in hidden)
    _generation += 1
    _status = replace(probe(), unsafe=unsafe)
    return _status


def status() -> Status:
    """This process's sandbox status (probed on first use when `configure` was not called)."""
    global _status
    if _status is None:
        _status = probe()  # once per process, a few milliseconds
    return _status


def tool_errors(*, network: bool = False) -> dict[str, str]:
    """What `GET /api/worlds/{w}` says about tools that are off because of the sandbox (`network`:
    the world allows the network)."""
    current = status()
    if not current.tools_allowed:
        return {"shell_exec": current.refusal()}
    refusal = current.network_refusal() if network else ""
    return {"shell_exec": refusal} if refusal else {}


def probe() -> Status:
    """Run `true` in the sandbox as tools would run; the first line of any failure is the reason."""
    bwrap = os.environ.get(BWRAP_ENV) or shutil.which("bwrap") or ""
    if not bwrap or not os.access(bwrap, os.X_OK):
        return Status(False, f"bubblewrap not found{': ' + bwrap if bwrap else ''}")
    if os.geteuid() == 0:
        try:
            world_uids()
        except ValueError as exc:
            return Status(False, str(exc))
    helpers = ["prlimit"] + (["setpriv"] if os.geteuid() == 0 else [])
    missing = [name for name in helpers if not shutil.which(name, path=_SYSTEM_PATH)]
    if missing:
        return Status(False, f"{' and '.join(missing)} (util-linux) not found")
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


_world_uids: range | None = None  # read from the environment on first use (and by `configure`)
_uids: dict[Path, int] = {}  # workspace path (as given when absolute, and resolved) -> its world's uid


def parse_world_uids(text: str) -> range:
    """The uids `AGENT_WORLD_SANDBOX_UIDS` names ("START-END", both included); ValueError says why not."""
    found = re.fullmatch(r"\s*(\d{1,10})\s*-\s*(\d{1,10})\s*", text)
    if found is None:
        raise ValueError(f"{UIDS_ENV}={text!r} is not a range: write START-END, both included "
                         f"(the default is {DEFAULT_WORLD_UIDS.start}-{DEFAULT_WORLD_UIDS.stop - 1})")
    start, end = int(found[1]), int(found[2])
    if start <= 65535:
        raise ValueError(f"{UIDS_ENV}={text!r}: START must be above 65535 (login users and nobody live below)")
    if end >= 2**31 - 1:
        raise ValueError(f"{UIDS_ENV}={text!r}: END must be below {2**31 - 1}")
    if end - start + 1 < MIN_WORLD_UIDS:
        raise ValueError(f"{UIDS_ENV}={text!r}: the range must hold at least {MIN_WORLD_UIDS} uids "
                         "(one for every world ever made; END is included)")
    return range(start, end + 1)


def world_uids() -> range:
    """The uids this process gives worlds (`AGENT_WORLD_SANDBOX_UIDS`, else the default); ValueError
    when the variable is set to something else than a valid range. Every process sharing a data
    folder must use the same range, or a world may hold a different uid in each."""
    global _world_uids
    if _world_uids is None:
        text = os.environ.get(UIDS_ENV, "").strip()
        _world_uids = parse_world_uids(text) if text else DEFAULT_WORLD_UIDS
    return _world_uids


def sandbox_uid(workspace: Path | None) -> int:
    """The user a root server runs `workspace`'s tools as: one per world (the workspace folder's own
    name is the world id, whatever path leads to it), no two worlds the same, the same in every
    process sharing the data folder and across restarts. Claimed on first use (blocking: a few
    system calls; `prepare_workspace` and `file_owner`, which run in threads, claim it first), then
    remembered by this process."""
    if workspace is None:
        return SANDBOX_UID
    given = Path(workspace)
    uid = _uids.get(given)
    if uid is not None:
        return uid
    resolved = given.resolve()
    uid = _uids.get(resolved)
    if uid is None:
        uid = claim_uid(resolved.parent / UID_REGISTRY, resolved.name, world_uids())
        _uids[resolved] = uid
    if given.is_absolute():
        _uids[given] = uid
    return uid


def claim_uid(registry: Path, world: str, uids: range) -> int:
    """`world`'s uid in `registry`: the one it holds, else the first free one it claims.

    A claim is a symbolic link `registry/<uid>` -> world id, made with symlink(2), which fails if
    the name exists: of two processes claiming one uid, one wins and the other reads whose it is.
    The probe starts at the uid the world id hashes to, with the registry's own salt (so that two
    data folders on one host, two servers or a test suite's many, do not give one world id, such as
    `demo`, one uid), and goes on in order, wrapping around. A claim is never changed or removed, so
    every process, now or later, skips the same uids and stops at the same one: a world never holds
    two uids in one range. A deleted world keeps its claim, so its uid is never given to another
    world: files it left (anywhere a tool could write, /tmp aside) may still belong to it."""
    os.makedirs(registry, mode=0o700, exist_ok=True)
    first = zlib.crc32(f"{_salt(registry)}:{world}".encode()) % len(uids)
    for step in range(len(uids)):
        uid = uids[(first + step) % len(uids)]
        holder = _claim(registry, str(uid), world)
        if holder == world:
            _sync(registry)  # the claim outlives a crash of the host, like the chown that follows
            return uid
    raise OSError(errno.ENOSPC, f"every sandbox uid from {uids.start} to {uids.stop - 1} is claimed "
                                f"(in {registry}): give {UIDS_ENV} a wider range")


def _claim(registry: Path, name: str, value: str) -> str | None:
    """What the link `registry/name` holds, made to hold `value` if it did not exist (None: not a link)."""
    entry = os.path.join(registry, name)
    while True:
        try:
            os.symlink(value, entry)
            return value
        except FileExistsError:
            pass
        try:
            return os.readlink(entry)
        except FileNotFoundError:
            continue  # removed by hand meanwhile: make it again
        except OSError:
            return None  # not a link (made by hand): taken all the same


def _salt(registry: Path) -> str:
    """The registry's salt, made at random by the first process to claim a uid in it."""
    salt = _claim(registry, "salt", secrets.token_hex(8))
    if salt is None:
        raise OSError(errno.EINVAL, f"{registry}/salt is not what this server made: remove it")
    return salt


def _sync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        _give_tree(top, owner)
        os.fchown(top, *owner)  # last: the mark that the walk is done
    finally:
        os.close(top)


MAX_GIVEN_DEPTH = 256  # folders deeper than this below a workspace keep their owner (one descriptor a level)
_NOT_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # gone, or swapped for a file or a link meanwhile


def _give_tree(top: int, owner: tuple[int, int]) -> None:
    """Give `owner` everything below the folder `top` (a descriptor). Root does this in a folder that
    a sandboxed tool may be changing right now (another replica's, or a walk that finished first), so
    no path is ever resolved: each folder is opened by name in its parent's descriptor with O_NOFOLLOW
    (a folder swapped for a link meanwhile is skipped, never followed out of the workspace), and a
    file with another name keeps its owner (a hard link, made while tools ran unsandboxed, can be a
    file outside the workspace: the database, the session key)."""
    frames: list[tuple[int, Iterator[str]]] = [(os.dup(top), iter(os.listdir(top)))]
    try:
        while frames:
            fd, names = frames[-1]
            name = next(names, None)
            if name is None:
                os.close(frames.pop()[0])
                continue
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode) and len(frames) < MAX_GIVEN_DEPTH:
                    inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    frames.append((inner, iter(())))  # closed with the others if what follows fails
                    os.fchown(inner, *owner)  # the folder opened, whatever its name means by now
                    frames[-1] = (inner, iter(os.listdir(inner)))
                elif not stat.S_ISDIR(info.st_mode) and info.st_nlink == 1:
                    os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in _NOT_THERE:
                    raise
    finally:
        for fd, _ in frames:
            os.close(fd)


def file_owner(workspace: Path) -> tuple[int, int] | None:
    """Who must own what the server writes into `workspace` so that sandboxed tools can change it."""
    if os.geteuid() != 0 or not status().sandboxed:
        return None
    uid = sandbox_uid(workspace)
    return uid, uid


def wrap(argv: Sequence[str], *, workspace: Path | None, network: bool = False, limits: Limits = SHELL_LIMITS,
         read_only: Sequence[Path] = (), current: Status | None = None) -> list[str]:
    """The command line that runs `argv` in the sandbox, in `workspace` (None: a private /tmp only).

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
    args = [*launcher, current.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--unshare-net", "--hostname", "sandbox", "--die-with-parent", "--new-session"]
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
    args += ["--chdir", str(Path(workspace).resolve()) if workspace is not None else "/tmp"]
    if root:
        uid = sandbox_uid(workspace)
        # Named inside (npm, git and ssh look the user up), by files that list only it and root.
        passwd, group = _identity_files(uid)
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


_identities: dict[int, tuple[str, str]] = {}
_identity_folder: list[Path] = []  # made on first use: a private folder of this process (mkdtemp)


def _identity_files(uid: int) -> tuple[str, str]:
    """An /etc/passwd and an /etc/group naming `uid` "sandbox", and root (written once per process and
    user, a few hundred bytes, in a private folder removed when the process exits). A folder or file
    gone meanwhile (a /tmp cleaner's age limit) is made again: bwrap fails on a missing bind source."""
    found = _identities.get(uid)
    if found is not None and _private_folder() and all(os.path.isfile(path) for path in found):
        return found
    if not _private_folder():  # never written into again: whoever made a folder of that name owns it
        _identity_folder[:] = [Path(tempfile.mkdtemp(prefix="agent-world-identities-"))]
        atexit.register(shutil.rmtree, _identity_folder[0], ignore_errors=True)
        _identities.clear()
    folder = _identity_folder[0]
    files = {"passwd": f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/sh\n",
             "group": f"root:x:0:\nsandbox:x:{uid}:\n"}
    for name, text in files.items():
        path = folder / f"{name}-{uid}"
        path.write_text(text)
        path.chmod(0o644)
    found = _identities[uid] = (str(folder / f"passwd-{uid}"), str(folder / f"group-{uid}"))
    return found


def _private_folder() -> bool:
    """Whether this process's identity folder is still there, its own and private (mkdtemp's 0700)."""
    if not _identity_folder:
        return False
    try:
        info = os.lstat(_identity_folder[0])
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


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

    def bind(self, path: Path) -> None:
        self._mount("--bind", path, "rw")

    def tmpfs(self, path: Path, *, perms: str = "0755", size: int | None = None) -> None:
        self._parents(path)
        self.args += ["--perms", perms] + (["--size", str(size)] if size else []) + ["--tmpfs", str(path)]
        self.roots[path] = "tmpfs"
