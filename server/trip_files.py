"""The files that carry work to the worker processes and their answers back (server/offload.py).

The pool's own pipes pickle in one C call holding the GIL: its feeder thread pickled each trip's work (a
16 MiB result, its 40 MB line) for 13-38 ms while the loop, and every world, waited, and its manager
thread unpickled each answer the same way. Pickled into a file, a large payload goes to the kernel in
`write` calls that release the GIL and comes back in `read` calls that do too; only making a `str` of it
holds the GIL, for one copy (into memory the allocator reuses, faulted in first without the GIL:
runtime.tune_allocator and warm_heap).

The files live only in memory (/dev/shm when it is a tmpfs with room: a container's holds 64 MiB unless
it is given more), in a folder only this user can enter, which no sandbox shows: work may carry the
secrets that redaction looks for (server/redact.py), and those must not reach a disk. Without room in
memory, work goes by the pipes. A folder is its process's while that process holds the lock on its
`.owner` file (the lock dies with the process, however it ends); this user's folders whose lock nobody
holds are removed before a new one is made.
"""
from __future__ import annotations

import fcntl
import functools
import logging
import os
import pickle
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from .runtime import warm_heap

logger = logging.getLogger(__name__)

MEMORY = Path("/dev/shm")
ROOM = 256 * 1024 * 1024  # bytes free that memory needs for trips: several of a 16 MiB result's at once
WARM_ABOVE = 1024 * 1024  # bytes of an answer past which the heap is warmed for it first (runtime.warm_heap)
_PREFIX = "agent-world-trips-"
_OWNER = ".owner"
_ABANDONED = 60.0  # seconds after which a hidden folder still without an owner file was left by a crash
_SWEEP_EVERY = 60.0  # seconds between sweeps while this process has no folder


class TripError(Exception):
    """A trip's file could not be written or read (memory full, the folder removed): the work goes by
    the pipes."""


class Folder:
    """This process's folder for trips, made at its first use (in a thread) and again if it was removed
    (systemd removes a user's /dev/shm files when their last session ends)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._owner: int | None = None  # the locked `.owner` file's descriptor
        self._said = False  # that memory has no room
        self._swept_at = -_SWEEP_EVERY  # when folders of processes that are gone were last removed

    def get(self) -> Path | None:
        """The folder, or None while memory has no room for trips."""
        with self._lock:
            lost = self._path is None or not self._path.is_dir()
            if lost and time.monotonic() - self._swept_at > _SWEEP_EVERY:  # before the room is judged: dead
                _remove_unowned()  # folders may be what fills it
                self._swept_at = time.monotonic()
            if not _roomy():
                if not self._said:
                    logger.warning("%s is not a tmpfs with %d MiB free: work goes to the worker processes by "
                                   "pipes, and large tool results stall every world while they cross",
                                   MEMORY, ROOM >> 20)
                    self._said = True
                return None
            if lost:
                self._drop()
                self._path, self._owner = _make() or (None, None)
            return self._path

    def remove(self) -> None:
        with self._lock:
            if self._path is not None:
                shutil.rmtree(self._path, ignore_errors=True)
            self._drop()

    def _drop(self) -> None:
        if self._owner is not None:
            os.close(self._owner)
        self._path = self._owner = None


def _roomy() -> bool:
    try:
        room = os.statvfs(MEMORY)
    except OSError:  # no such folder
        return False
    return room.f_bavail * room.f_frsize >= ROOM and _in_memory(MEMORY)


@functools.cache
def _in_memory(path: Path) -> bool:
    """Whether `path` is on a tmpfs or ramfs (by the mount table; where there is none, trust the name)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return True
    resolved, kind = str(path.resolve()), ""
    for point, fs in sorted((m for m in mounts if len(m) == 2), key=lambda m: len(m[0])):
        if resolved == point or resolved.startswith(point.rstrip("/") + "/"):
            kind = fs  # the longest mount point holding the path wins
    return kind in ("tmpfs", "ramfs")


def _make() -> tuple[Path, int] | None:
    try:
        making = Path(tempfile.mkdtemp(prefix=f".{_PREFIX}", dir=MEMORY))
    except OSError:
        return None
    owner = None
    try:
        owner = os.open(making / _OWNER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Renamed once locked: the rename fails if a sweep took the folder in the instant before the lock.
        path = MEMORY / making.name.removeprefix(".")
        making.rename(path)
        return path, owner
    except OSError:
        if owner is not None:
            os.close(owner)
        shutil.rmtree(making, ignore_errors=True)
        return None


def _remove_unowned() -> None:
    """Remove this user's trip folders whose owner is gone (killed before it could remove its own)."""
    for entry in [*MEMORY.glob(f"{_PREFIX}*"), *MEMORY.glob(f".{_PREFIX}*")]:
        try:
            found = os.lstat(entry)
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
                continue  # another user's, or not a folder: not ours to judge
            owner = os.open(entry / _OWNER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:  # no owner file: being made now, or left by a crash long ago
            if entry.name.startswith(".") and time.time() - found.st_mtime > _ABANDONED:
                shutil.rmtree(entry, ignore_errors=True)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process is alive
            continue
        else:
            shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(owner)


class Trip:
    """One run's two files: its work, then its answer. Made, written and read in threads; once the run
    is given up, no thread makes more, what was made is removed, and a worker that has not begun the
    work does not run it."""

    def __init__(self, folder: Folder) -> None:
        self._folder = folder
        self._lock = threading.Lock()
        self._given_up = False
        self._files: tuple[str, ...] = ()  # to remove if the run is given up
        self._future: Future[Any] | None = None

    def hand_over(self, pool: ProcessPoolExecutor, work: Callable[[], Any]) -> tuple[Future[Any], bool] | None:
        """In a thread: the work into its file and to a worker, and whether it went by the pipes instead
        (no room in memory; its future then holds the answer). None: the run was given up meanwhile."""
        folder = self._folder.get()
        if folder is None:
            return self._submitted(pool, work, by_pipe=True)
        try:
            with self._lock:
                if self._given_up:
                    return None
                fd, work_file = tempfile.mkstemp(dir=folder, suffix=".work")
                os.close(fd)
                answer_file = work_file.removesuffix(".work") + ".answer"
                self._files = (work_file, answer_file)
                # Made now, and only opened by the worker: once the run is given up (its files removed),
                # the worker finds no file to answer into and leaves none behind.
                os.close(os.open(answer_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            with open(os.open(work_file, os.O_WRONLY | os.O_TRUNC), "wb") as file:  # (never made again)
                pickle.dump(work, file, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError as exc:
            remove(self.give_up())
            raise TripError(f"the work could not be written for a worker: {exc}") from exc
        return self._submitted(pool, partial(carry, work_file, answer_file), by_pipe=False)

    def _submitted(self, pool: ProcessPoolExecutor, call: Callable[[], Any],
                   by_pipe: bool) -> tuple[Future[Any], bool] | None:
        with self._lock:
            if self._given_up:
                return None
            self._future = future = pool.submit(call)
        return future, by_pipe

    def answer(self, delivered: tuple[Any] | None) -> Any:
        """In a thread: the worker's answer (`carry`'s return: the answer itself when its file could not
        be written), its file removed."""
        with self._lock:
            files, self._files = self._files, ()
        if not files:
            raise TripError("the run was given up")
        answer_file = files[1]
        if delivered is not None:
            remove((answer_file,))
            return delivered[0]
        try:
            with open(answer_file, "rb", buffering=0) as file:
                size = os.fstat(file.fileno()).st_size
                if size > WARM_ABOVE:  # room for what is read, and the objects made of it
                    warm_heap(2 * size)
                answer = pickle.load(file)
            os.unlink(answer_file)
        except OSError as exc:
            raise TripError(f"a worker's answer could not be read: {exc}") from exc
        return answer

    def give_up(self) -> tuple[str, ...]:
        """The files to remove (none once the answer was read); nothing is handed over after this, and
        work a worker has not begun is cancelled."""
        with self._lock:
            self._given_up = True
            files, self._files = self._files, ()
            future = self._future
        if future is not None:
            future.cancel()
        return files


def carry(work_file: str, answer_file: str) -> tuple[Any] | None:
    """In a worker: the work from its file, and its answer into the other (None); the answer itself if it
    could not be written there (memory full: the work is not done twice). Each file is removed by its
    reader: freeing 40 MB of memory on the loop took it 16 ms."""
    try:
        answer_to = os.open(answer_file, os.O_WRONLY | os.O_TRUNC)  # first: a run given up is not worked on
    except OSError as exc:
        raise TripError(f"a worker found no file for its answer: {exc}") from exc
    try:
        with open(work_file, "rb", buffering=0) as file:
            work: Callable[[], Any] = pickle.load(file)
        os.unlink(work_file)
    except OSError as exc:
        os.close(answer_to)
        raise TripError(f"a worker could not read its work: {exc}") from exc
    answer = work()
    try:
        with open(answer_to, "wb") as file:
            pickle.dump(answer, file, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError:
        return (answer,)
    return None


def remove(files: tuple[str, ...]) -> None:
    for path in files:
        Path(path).unlink(missing_ok=True)
