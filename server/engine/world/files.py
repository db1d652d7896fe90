"""A world's workspace as people see it: a folder listed a page at a time, a file or a folder (as a zip) read
out, a file put in by upload (a `file_uploaded` event that the chat's agents read as a note).

Every path is walked one component at a time without following symbolic links and files with other hard
links are refused (server/tools/workspace_fs.py, as file_read and file_write do), so a link a tool planted
leads nowhere. The world's `file_read` rules hold here too: a path that a rule denies, or whose reading
would need a person, is not served, is left out of a zip and is marked in a listing (`file_access`, as an
approval request's diff asks it); an upload to a path a `file_write` rule denies is refused. All filesystem
work runs in threads: the workspace may be on a shared volume (distributed mode) and a folder may be large.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import secrets
import stat
import tempfile
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import IO, Any

from ... import events, vocab
from ...errors import AppError
from ...log import Op, Tag
from ...tools.base import Tool, ToolError
from ...tools.builtin import builtin_tools
from ...tools.workspace_fs import (
    DIR_FLAGS,
    FILE_FLAGS,
    checked,
    components,
    display,
    give_to_sandbox,
    open_dir,
    open_parent,
    open_to_read,
    os_error,
    workspace_root,
)
from ..actors import Actor
from ..approvals.ownership import Refusals
from ..approvals.policy import file_access
from ..store import Store
from .worlds import Worlds

LIST_SCAN = 10_000  # names read from one folder at most; beyond them the listing says it is capped
LIST_PAGE, MAX_LIST_PAGE = 200, 1000  # entries of one page of a listing: by default, at most
MAX_UPLOAD = 25 << 20  # bytes of one upload
ZIP_MAX_BYTES = 256 << 20  # bytes of files a folder's zip may hold
ZIP_MAX_FILES = 10_000
ZIP_MAX_DEPTH = 256  # folders within folders a zip descends; deeper ones are left out (named in its comment)
CHUNK = 256 << 10  # bytes read or written per trip to a thread
TOO_LARGE = "too_large"  # the API's code for a body over its cap (server/api/bodies.py)
_PART = ".upload-"  # an upload being written: `.upload-<random>.part` beside its file, renamed when complete


@dataclass
class Download:
    """A file, or a folder as a zip, ready to stream: `name` to save it as, `chunks` its bytes."""
    name: str
    size: int
    folder: bool
    chunks: AsyncIterator[bytes]


Guard = Callable[[str], str | None]  # a workspace path -> the verdict that keeps it from being read, or None


@cache
def _file_tool(name: str) -> Tool:
    """The built-in file_read or file_write, whose rules and default the panel's reads and uploads follow."""
    return next(tool for tool in builtin_tools() if tool.name == name)


def _unreadable(shown: str, verdict: str) -> AppError:
    if verdict == "deny":
        return AppError(vocab.FORBIDDEN, f"a rule denies reading {shown}: it is not served")
    return AppError(vocab.FORBIDDEN, f"a rule keeps {shown} from being read without a person: it is not served")


def _refused(exc: ToolError | OSError, shown: str = "", verb: str = "read") -> AppError:
    """A path problem as the API's error: a missing file is `not_found`, anything else `invalid`."""
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOENT:
            return AppError(vocab.NOT_FOUND, f"no such file or folder: {shown}")
        exc = os_error(exc, shown, verb)
    return AppError(vocab.INVALID, str(exc))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _kind(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "other"


def _printable(name: str) -> bool:
    """A name that JSON and the page can carry as it is (not bytes that are not UTF-8)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _chunks(file: IO[bytes], size: int) -> Iterator[bytes]:
    """At most `size` bytes of `file` (its size when opened), a chunk at a time: a file that a process keeps
    appending to is read as it was, never to an end that keeps moving."""
    left = size
    while left > 0 and (chunk := file.read(min(CHUNK, left))):
        left -= len(chunk)
        yield chunk


async def _stream(file: IO[bytes], size: int) -> AsyncIterator[bytes]:
    """`_chunks(file, size)`, each read in a thread; the file closed at the end or when the reader leaves."""
    chunks = _chunks(file, size)
    try:
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            yield chunk
    finally:
        file.close()


def _entries(dir_fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(dir_fd) as found:
        return sorted((e for e in found if _printable(e.name)), key=lambda e: e.name)


class WorkspaceFiles:
    def __init__(self, store: Store, worlds: Worlds, refusals: Refusals,
                 workspace_for: Callable[[str], Path]) -> None:
        self.store = store
        self.worlds = worlds
        self.refusals = refusals
        self.workspace_for = workspace_for

    async def _where(self, world: str, raw: object, *, root_ok: bool) -> tuple[Path, tuple[str, ...]]:
        """The workspace's resolved root and the components of `raw` below it (`invalid` if it climbs out)."""
        workspace = await asyncio.to_thread(self.workspace_for, world)
        root = await workspace_root(workspace)
        if raw in (None, "", ".", "/") and root_ok:
            return root, ()
        if isinstance(raw, str) and raw.startswith("/"):
            raise AppError(vocab.INVALID, "path must be relative to the workspace")
        try:
            parts = components(root, workspace, raw)
        except ToolError as exc:
            raise AppError(vocab.INVALID, str(exc)) from None
        if not parts and not root_ok:
            raise AppError(vocab.INVALID, "path must name a file, not the workspace itself")
        return root, parts

    async def _guard(self, world: str) -> Guard:
        """What keeps a path from being read: the verdict `file_read` of it would get (as no agent) where
        that is not `allow`. The world's rules are read once, so a whole listing or zip is judged by the same."""
        rules, reader = await self.worlds.rules(world), _file_tool("file_read")

        def guarded(path: str) -> str | None:
            verdict = file_access(reader, path, rules=rules).verdict
            return None if verdict == "allow" else verdict
        return guarded

    # -- reading: any role (spectators watch, and reading is watching), as the world's file_read rules let ---
    async def list(self, world: str, path: object, offset: int = 0, limit: int = LIST_PAGE) -> dict[str, Any]:
        """One page of a folder: its entries, folders first then by name; `total` of the names read (at most
        LIST_SCAN, `capped` beyond), `next` the offset of the next page or None. An entry that a rule keeps
        from being read is listed with `guarded`: `deny`, or `ask` (reading it needs a person)."""
        root, parts = await self._where(world, path, root_ok=True)
        shown = display(parts) if parts else ""
        guarded = await self._guard(world)

        def scan() -> dict[str, Any]:
            try:
                fd = open_dir(root, parts)
            except OSError as exc:
                raise _refused(exc, shown) from None
            try:
                names: list[tuple[bool, str, str]] = []
                capped = unreadable = 0
                with os.scandir(fd) as found:
                    for entry in found:
                        if len(names) >= LIST_SCAN:
                            capped = 1
                            break
                        if not _printable(entry.name):
                            unreadable += 1
                            continue
                        kind = _kind(entry)
                        names.append((kind != "dir", entry.name, kind))
                names.sort()
                entries = []
                for _, name, kind in names[offset:offset + limit]:
                    try:
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        continue  # gone meanwhile
                    inside = "/".join((*parts, name))
                    entries.append({"name": name, "path": inside, "type": kind,
                                    "size": info.st_size if kind == "file" else None,
                                    "modified": _iso(info.st_mtime), "guarded": guarded(inside)})
            finally:
                os.close(fd)
            after = offset + limit
            return {"path": shown, "entries": entries, "total": len(names), "capped": bool(capped),
                    "unreadable": unreadable, "offset": offset, "next": after if after < len(names) else None}
        return await asyncio.to_thread(scan)

    async def head(self, world: str, path: object, limit: int) -> tuple[str, bytes, int]:
        """A file's first `limit` bytes and its size (for previews): (its path, the bytes, the size)."""
        root, parts = await self._where(world, path, root_ok=False)
        shown = display(parts)
        if verdict := (await self._guard(world))(shown):
            raise _unreadable(shown, verdict)

        def read() -> tuple[bytes, int]:
            try:
                fd = open_to_read(root, parts)
                with os.fdopen(fd, "rb") as f:
                    size = checked(fd, shown).st_size
                    os.set_blocking(fd, True)
                    return f.read(limit), size
            except (OSError, ToolError) as exc:
                raise _refused(exc, shown) from None
        data, size = await asyncio.to_thread(read)
        return shown, data, size

    async def download(self, world: str, path: object) -> Download:
        """A file as it is (the bytes it had when opened), or a folder (the workspace itself too) as a zip of
        what it holds that may be read."""
        root, parts = await self._where(world, path, root_ok=True)
        shown = display(parts)
        name = parts[-1] if parts else world
        guarded = await self._guard(world)
        if parts and (verdict := guarded(shown)):
            raise _unreadable(shown, verdict)

        def open_it() -> Download:
            try:
                if not parts:
                    return self._zip(os.open(root, DIR_FLAGS), name, parts, guarded)
                parent = open_parent(root, parts, create=False)
                try:
                    info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        return self._zip(os.open(parts[-1], DIR_FLAGS, dir_fd=parent), name, parts, guarded)
                    fd = os.open(parts[-1], os.O_RDONLY | FILE_FLAGS, dir_fd=parent)
                finally:
                    os.close(parent)
                file = os.fdopen(fd, "rb")
                try:
                    size = checked(fd, shown).st_size
                    os.set_blocking(fd, True)
                except BaseException:
                    file.close()
                    raise
                return Download(name, size, False, _stream(file, size))
            except (OSError, ToolError) as exc:
                raise _refused(exc, shown) from None
        return await asyncio.to_thread(open_it)

    def _zip(self, fd: int, name: str, parts: tuple[str, ...], guarded: Guard) -> Download:
        """The folder `parts` open as `fd` (closed here) as a zip in a temporary file, walked depth first
        without recursion (a descriptor per level, ZIP_MAX_DEPTH levels at most). Each file is read up to the
        size it had when opened. Left out, and named in the zip's comment: links, files with other hard links
        and anything but files and folders; what a rule keeps from being read; folders deeper than the cap."""
        out = tempfile.TemporaryFile()
        left_out: dict[str, list[str]] = {
            "links, hard-linked or special files": [],
            "a rule denies reading them, or reading them needs a person": [],
            f"folders deeper than {ZIP_MAX_DEPTH}": []}
        links, ruled, deep = left_out.values()
        totals = [0, 0]  # bytes, files

        def add_file(dir_fd: int, entry: os.DirEntry[str], inside: str, archive: zipfile.ZipFile) -> None:
            try:
                file_fd = os.open(entry.name, os.O_RDONLY | FILE_FLAGS, dir_fd=dir_fd)
            except OSError:
                links.append(inside)
                return
            with os.fdopen(file_fd, "rb") as source:
                info = os.fstat(file_fd)
                if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                    links.append(inside)
                    return
                totals[0] += info.st_size
                totals[1] += 1
                if totals[0] > ZIP_MAX_BYTES or totals[1] > ZIP_MAX_FILES:
                    raise AppError(vocab.INVALID, f"the folder holds more than {ZIP_MAX_BYTES >> 20} MiB or "
                                                  f"{ZIP_MAX_FILES} files: download its parts")
                os.set_blocking(file_fd, True)
                stamp = datetime.fromtimestamp(max(info.st_mtime, 315532800), UTC)  # zip dates start in 1980
                member = zipfile.ZipInfo(inside, stamp.timetuple()[:6])
                member.compress_type = zipfile.ZIP_DEFLATED
                with archive.open(member, "w") as target:
                    for chunk in _chunks(source, info.st_size):
                        target.write(chunk)

        def add(archive: zipfile.ZipFile) -> None:
            stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = [(fd, "", iter(_entries(fd)))]
            try:
                while stack:
                    dir_fd, prefix, pending = stack[-1]
                    entry = next(pending, None)
                    if entry is None:
                        stack.pop()
                        if stack:  # the folder asked for is the caller's to close
                            os.close(dir_fd)
                        continue
                    inside, kind = prefix + entry.name, _kind(entry)
                    if kind not in ("dir", "file"):
                        links.append(inside)
                    elif guarded("/".join((*parts, inside))):
                        ruled.append(inside + ("/" if kind == "dir" else ""))
                    elif kind == "file":
                        add_file(dir_fd, entry, inside, archive)
                    elif len(stack) > ZIP_MAX_DEPTH:
                        deep.append(inside + "/")
                    else:
                        sub = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
                        try:
                            found = _entries(sub)
                        except BaseException:
                            os.close(sub)
                            raise
                        archive.writestr(zipfile.ZipInfo(inside + "/"), b"")
                        stack.append((sub, inside + "/", iter(found)))
            finally:
                for dir_fd, _, _ in stack[1:]:
                    os.close(dir_fd)

        try:
            with zipfile.ZipFile(out, "w", allowZip64=True) as archive:
                add(archive)
                said = [f"{why}: {', '.join(names)}" for why, names in left_out.items() if names]
                if said:
                    archive.comment = ("left out: " + "; ".join(said))[:60000].encode()
            size = out.tell()
            out.seek(0)
        except BaseException:
            out.close()
            raise
        finally:
            os.close(fd)
        return Download(f"{name}.zip", size, True, _stream(out, size))

    # -- writing: members and the owner --------------------------------------------------------------------
    async def upload(self, world: str, actor: Actor, path: object, chat: object, body: AsyncIterator[bytes],
                     declared: int | None, cap: int = MAX_UPLOAD) -> vocab.Event:
        """Put `body` at `path` (its folders made), replacing a file there, and say so in `chat` (the latest
        when None): a `file_uploaded` event every agent of the chat reads. The role is checked first, then the
        path and the declared size, before a byte is read; the bytes go to a temporary file beside the target,
        renamed over it once all have come (a link there is replaced, never followed). A `file_write` rule that
        denies the path refuses it (403); one that asks is answered by the person uploading."""
        await self.refusals.require(world, actor, vocab.CAN_SEND, "upload files")
        if chat is None:
            chat = await self.worlds.latest_chat(world)
        elif not isinstance(chat, str):
            raise AppError(vocab.INVALID, "chat must be a chat id")
        await self.worlds.require_chat(world, chat)
        root, parts = await self._where(world, path, root_ok=False)
        shown = display(parts)
        if parts[-1].startswith(_PART):
            raise AppError(vocab.INVALID, f"names starting with {_PART} are the server's (uploads in progress)")
        # A person uploading is the approval an `ask` rule wants; a `deny` rule refuses people too.
        ruling = file_access(_file_tool("file_write"), shown, rules=await self.worlds.rules(world))
        if ruling.verdict == "deny":
            raise AppError(vocab.FORBIDDEN, f"a rule denies writing {shown}: {ruling.reason}")
        if declared is not None and declared > cap:
            raise AppError(TOO_LARGE, f"the file is larger than {cap} bytes", status=413)
        temp = f"{_PART}{secrets.token_hex(8)}.part"

        def start() -> tuple[int, IO[bytes]]:
            try:
                parent = open_parent(root, parts, create=True)
            except OSError as exc:
                raise _refused(exc, shown, "write") from None
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                             dir_fd=parent)
                give_to_sandbox(root, temp, parent)
            except OSError as exc:
                os.close(parent)
                raise _refused(exc, shown, "write") from None
            return parent, os.fdopen(fd, "wb")

        parent, out = await asyncio.to_thread(start)
        digest = hashlib.sha256()
        size = 0

        def write(data: bytes) -> None:
            digest.update(data)
            out.write(data)

        def finish() -> None:
            out.close()
            try:
                os.rename(temp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
            except OSError as exc:
                raise _refused(exc, shown, "write") from None

        done = False
        try:
            pending: list[bytes] = []
            held = 0
            async for chunk in body:
                size += len(chunk)
                if size > cap:  # a lying or absent Content-Length is caught here
                    raise AppError(TOO_LARGE, f"the file is larger than {cap} bytes", status=413)
                pending.append(chunk)
                held += len(chunk)
                if held >= CHUNK:
                    await asyncio.to_thread(write, b"".join(pending))
                    pending, held = [], 0
            if pending:
                await asyncio.to_thread(write, b"".join(pending))
            await asyncio.to_thread(finish)
            done = True
        finally:
            if not done:  # cancelled, refused or failed: nothing half-written stays behind
                out.close()
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=parent)
            os.close(parent)
        event = events.file_uploaded(chat, shown, size, digest.hexdigest(), actor.sender, actor.identity)
        ops: list[Op] = [Tag(vocab.shared_memory_tag(chat)), Tag(vocab.AUDIT_TAG)]
        return await self.store.append(world, event, ops)


def upload_note(event: vocab.Event) -> str:
    """How an agent reads a `file_uploaded` event (server/engine/turns/llm_input.py)."""
    who = vocab.member_of(event.get("sender")) or "someone"
    return (f"[Note: {who} uploaded the file {event.get('path')} to the workspace "
            f"({event.get('size')} bytes, sha256 {event.get('sha256')})]")
