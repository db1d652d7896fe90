"""The files that carry work to the worker processes and their answers back (server/offload.py).

The pool's own pipes pickle in one C call holding the GIL: its feeder thread pickled each trip's work (a
16 MiB result, its 40 MB line) for 13-38 ms while the loop, and every world, waited, and its manager
thread unpickled each answer the same way. Pickled into a file, a large payload goes to the kernel in
`write` calls that release the GIL and comes back in `read` calls that do too; only making a `str` of it
holds the GIL, for one copy (into memory the allocator reuses: runtime.tune_allocator).

The files live only in memory (/dev/shm, when it has room: a container's holds 64 MiB unless it is given
more), in a folder only this user can enter: work may carry the secrets that redaction looks for
(server/redact.py), and those must not reach a disk. Without such a folder, work goes by the pipes. A
folder is its process's for as long as that process holds the lock on its `.owner` file (it dies with
the process, however it ends); folders whose lock nobody holds are removed when a new folder is made.
"""
from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

MEMORY = Path("/dev/shm")
ROOM = 256 * 1024 * 1024  # bytes free that the memory folder needs: several trips of a 16 MiB result at once
_PREFIX = "agent-world-trips-"
_OWNER = ".owner"


class TripError(Exception):
    """A trip's file could not be written or read (the memory is full, say): the work goes by the pipes."""


class Folder:
    """This process's folder for trips, made at its first use (in a thread) and again if it was removed
    (systemd removes a user's /dev/shm files when their last session ends)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._owner: int | None = None  # the locked `.owner` file's descriptor

    def get(self) -> Path | None:
        """The folder, or None where memory has no room for one."""
        with self._lock:
            if self._path is None or not self._path.is_dir():
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


def _make() -> tuple[Path, int] | None:
    try:
        room = os.statvfs(MEMORY)
        if room.f_bavail * room.f_frsize < ROOM or not os.access(MEMORY, os.W_OK | os.X_OK):
            return None
        _remove_unowned()
        # Made under a hidden name and renamed once its lock is held: a folder with our prefix is owned.
        making = Path(tempfile.mkdtemp(prefix=f".{_PREFIX}", dir=MEMORY))
    except OSError:  # no such memory: the pipes
        return None
    owner = None
    try:
        owner = os.open(making / _OWNER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        fcntl.flock(owner, fcntl.LOCK_EX)
        path = MEMORY / making.name.removeprefix(".")
        making.rename(path)
        return path, owner
    except OSError:  # no room after all, or swept by another process in the instant before the lock
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
            owner = os.open(entry / _OWNER, os.O_RDONLY | os.O_NOFOLLOW)
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
    """One run's two files: its work, then its answer. Made, written and read in threads; a run given up
    removes what it made, even while a thread is still making it."""

    def __init__(self, folder: Folder) -> None:
        self._folder = folder
        self._lock = threading.Lock()
        self._given_up = False
        self._files: tuple[str, str] | None = None  # (work, answer): to remove if the run is given up
        self.by_pipe = False  # no folder in memory: the work went by the pipes, its future holds the answer

    def hand_over(self, pool: ProcessPoolExecutor, work: Callable[[], Any]) -> Future[Any] | None:
        """In a thread: the work into its file, and to a worker (None: the run was given up meanwhile)."""
        folder = self._folder.get()
        if folder is None:
            self.by_pipe = True
            return pool.submit(work)
        try:
            with self._lock:
                if self._given_up:  # (before the thread started)
                    return None
                fd, work_file = tempfile.mkstemp(dir=folder, suffix=".work")
                os.close(fd)
                answer_file = work_file.removesuffix(".work") + ".answer"
                # Made now, and only written by the worker: a run given up (its files removed) leaves none.
                os.close(os.open(answer_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                self._files = (work_file, answer_file)
            with open(os.open(work_file, os.O_WRONLY | os.O_TRUNC), "wb") as file:  # (not made again)
                pickle.dump(work, file, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError as exc:
            remove(self.give_up() or ())
            raise TripError(f"the work could not be written for a worker: {exc}") from exc
        if self._gone():  # while the work was written: its files are removed, and no worker is bothered
            return None
        return pool.submit(partial(carry, work_file, answer_file))

    def _gone(self) -> bool:
        with self._lock:
            return self._given_up

    def answer(self) -> Any:
        """In a thread: the worker's answer, its file removed."""
        assert self._files is not None, "handed over"
        answer_file = self._files[1]
        try:
            with open(answer_file, "rb", buffering=0) as file:
                answer = pickle.load(file)
            os.unlink(answer_file)
        except OSError as exc:
            raise TripError(f"a worker's answer could not be read: {exc}") from exc
        with self._lock:
            self._files = None
        return answer

    def give_up(self) -> tuple[str, str] | None:
        """The files to remove (none once the answer was read); no thread makes more after this."""
        with self._lock:
            self._given_up = True
            files, self._files = self._files, None
        return files


def carry(work_file: str, answer_file: str) -> None:
    """In a worker: the work from its file, and its answer into the other. Each file is removed by its
    reader (freeing 40 MB of memory on the loop took it 16 ms)."""
    try:
        with open(work_file, "rb", buffering=0) as file:
            work: Callable[[], Any] = pickle.load(file)
        os.unlink(work_file)
    except OSError as exc:  # (a run given up: nobody waits for this)
        raise TripError(f"a worker could not read its work: {exc}") from exc
    answer = work()
    try:
        with open(os.open(answer_file, os.O_WRONLY | os.O_TRUNC), "wb") as file:
            pickle.dump(answer, file, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError as exc:
        raise TripError(f"a worker could not write its answer: {exc}") from exc


def remove(files: tuple[str, ...]) -> None:
    for path in files:
        Path(path).unlink(missing_ok=True)
