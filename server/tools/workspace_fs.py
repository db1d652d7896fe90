"""Paths in a world's workspace, walked without following links: the tools' file access and the files
panel's (server/engine/world/files.py) share these, so both refuse the same escapes."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Any

from .base import ToolError
from .sandbox import bubblewrap as sandbox

# Workspaces prepared before: path -> ((device, inode), the resolved path). See workspace_root.
_prepared: dict[Path, tuple[tuple[int, int], Path]] = {}


async def workspace_root(workspace: Path) -> Path:
    """The workspace, created and given to the sandbox user if need be; its resolved path."""
    # The same directory as last time, still the sandbox user's: one stat (as warm.py's) and no
    # thread, whose wake-up cost 0.2 ms at the median and 1-5 ms under load, on an approval's path.
    known = _prepared.get(workspace)
    if known is not None:
        try:
            info = os.stat(workspace)
        except OSError:
            info = None
        owner = sandbox.file_owner(workspace)
        if info is not None and (info.st_dev, info.st_ino) == known[0] and stat.S_ISDIR(info.st_mode) and (
                owner is None or info.st_uid == owner[0]):
            return known[1]

    def make() -> Path:
        workspace.mkdir(parents=True, exist_ok=True)
        sandbox.prepare_workspace(workspace)
        root = workspace.resolve()
        info = os.stat(root)
        _prepared[workspace] = ((info.st_dev, info.st_ino), root)
        return root
    return await asyncio.to_thread(make)


def components(root: Path, workspace: Path, raw: Any) -> tuple[str, ...]:
    """The path components of `raw` (relative to the workspace, or absolute) below the workspace.

    Lexical only: `..` may not climb out, and the components are then opened one by one without
    following any symbolic link, so no link (planted by a shell command, say) leads anywhere.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("path must be a non-empty string")
    if "\x00" in raw:
        raise ToolError("path must not contain NUL characters")
    normalized = Path(os.path.normpath(raw))
    if normalized.is_absolute():
        for base in (root, workspace.absolute()):
            if normalized.is_relative_to(base):
                return normalized.relative_to(base).parts
        raise ToolError(f"path {raw!r} is outside the workspace")
    if normalized.parts[:1] == ("..",):
        raise ToolError(f"path {raw!r} is outside the workspace")
    return () if normalized == Path(".") else normalized.parts


def display(parts: tuple[str, ...]) -> str:
    # Paths shown to the model are workspace-relative: the server's layout is none of its business.
    return "/".join(parts) or "."


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # non-blocking: opening a FIFO must not hang


def open_dir(root: Path, parts: tuple[str, ...], *, create: bool = False) -> int:
    """A descriptor of the directory `parts` name, walked to without following links (`create`: making
    missing ones, given to the sandbox user)."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
                    give_to_sandbox(root, part, fd)
            inner = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_parent(root: Path, parts: tuple[str, ...], *, create: bool) -> int:
    """A descriptor of the directory holding the last of `parts`, walked to without following links."""
    return open_dir(root, parts[:-1], create=create)


def open_to_read(root: Path, parts: tuple[str, ...]) -> int:
    """A read-only descriptor of the file `parts` name, walked to without following links."""
    parent = open_parent(root, parts, create=False)
    try:
        return os.open(parts[-1], os.O_RDONLY | FILE_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)


def give_to_sandbox(workspace: Path, name: str, dir_fd: int) -> None:
    owner = sandbox.file_owner(workspace)
    if owner is not None:
        os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)


def checked(fd: int, shown: str) -> os.stat_result:
    """The file's status, if it is a regular file with no other name (a hard link could be the database)."""
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{shown} is a directory")
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{shown} is not a regular file")
    if info.st_nlink > 1:
        raise ToolError(f"{shown} has other hard links: refused, a hard link can point outside the workspace")
    return info


def os_error(exc: OSError, shown: str, verb: str) -> ToolError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return ToolError(f"{shown}: symbolic links are not followed (they could lead outside the workspace), "
                         "and every part of the path must be a folder")
    if exc.errno == errno.ENOENT:
        return ToolError(f"no such file: {shown}")
    if exc.errno == errno.EISDIR:
        return ToolError(f"{shown} is a directory")
    return ToolError(f"cannot {verb} {shown}: {exc.strerror}")
