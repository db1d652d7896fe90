"""Which user a world's tools run as, when the server runs as root.

The kernel never applies the process-count limit to root, and root owns the files a tool must not
touch; the limit counts a user's processes host-wide, so one world's fork bomb must not take another
world's process slots. So each world's tools run as a uid of that world's own: claimed once in the
data folder (every replica and every restart finds the same), named `sandbox` inside the sandbox by
passwd and group files of their own, and given the world's workspace.
"""
from __future__ import annotations

import atexit
import errno
import os
import re
import secrets
import shutil
import stat
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

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


def forget() -> None:
    """Read `AGENT_WORLD_SANDBOX_UIDS` again and forget the uids found (`sandbox.configure`)."""
    global _world_uids
    _world_uids = None
    _uids.clear()


MAX_GIVEN_DEPTH = 256  # folders deeper than this below a workspace keep their owner (one descriptor a level)
_NOT_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # gone, or swapped for a file or a link meanwhile


def give_tree(top: int, owner: tuple[int, int]) -> None:
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


_identities: dict[int, tuple[str, str]] = {}
_identity_folder: list[Path] = []  # made on first use: a private folder of this process (mkdtemp)


def identity_files(uid: int) -> tuple[str, str]:
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
