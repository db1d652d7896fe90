"""The files that carry work to the worker processes and back (server/trip_files.py): the work really goes
by them, nothing is left behind however a run ends, and only folders whose owner is gone are removed."""
from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from server import offload, trip_files
from tests.fixtures.eventually import eventually_async


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """What was handed to the pool, with the workers stopped (and their folder removed) after the test.
    Any room in /dev/shm will do (a container's holds 64 MiB)."""
    monkeypatch.setattr(trip_files, "ROOM", 0)
    calls: list[Any] = []
    submit = ProcessPoolExecutor.submit

    def recorded(self: ProcessPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(fn)
        return submit(self, fn, *args, **kwargs)
    monkeypatch.setattr(ProcessPoolExecutor, "submit", recorded)
    offload.shutdown()
    try:
        yield calls
    finally:
        offload.shutdown()


def _left() -> list[str]:
    """The files in this process's folder."""
    folder = offload._folder.get()
    assert folder is not None
    return sorted(path.name for path in folder.iterdir())


def _fail(message: str) -> None:
    raise ValueError(message)


async def test_work_and_a_large_answer_go_by_file_and_leave_nothing_behind(submitted: list[Any]) -> None:
    """Through the pool's pipes a 16 MiB result was pickled in one call holding the GIL (13-38 ms), while
    every world waited."""
    text = "lorem ipsum é€ \U0001f600 " * 700_000  # 16 MB, not only ASCII
    assert await offload.run(partial(str.upper, text)) == text.upper()
    with pytest.raises(ValueError, match="refused"):
        await offload.run(partial(_fail, "refused"))
    assert [call.func for call in submitted] == [trip_files.carry, trip_files.carry]
    # (a failed run's files are removed by a thread, not awaited)
    await eventually_async(_left, accept=lambda left: left == [".owner"], what="the files removed", timeout=10)


async def test_where_memory_has_no_room_work_goes_by_the_pipes(submitted: list[Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trip_files, "ROOM", 1 << 62)
    work = partial(sorted, [3, 1, 2])
    assert await offload.run(work) == [1, 2, 3]
    assert submitted == [work]  # never written to a disk: work may carry the secrets redaction looks for


class _Blocking:
    """Work whose pickling waits for `go` (and says when it has begun)."""

    def __init__(self, begun: threading.Event, go: threading.Event) -> None:
        self.begun, self.go = begun, go

    def __reduce__(self) -> tuple[Any, ...]:
        self.begun.set()
        self.go.wait(10)
        return (list, ())


async def test_a_run_given_up_while_its_work_is_written_leaves_nothing(submitted: list[Any]) -> None:
    await offload.run(partial(os.getpid))  # the folder is made
    begun, go = threading.Event(), threading.Event()
    run: asyncio.Future[Any] = asyncio.ensure_future(offload.run(_Blocking(begun, go)))  # type: ignore[arg-type]
    await asyncio.to_thread(begun.wait, 10)
    assert any(name.endswith(".work") for name in _left())
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    go.set()  # the thread writes on, into files already removed, and hands nothing to a worker
    await eventually_async(_left, accept=lambda left: left == [".owner"], what="the files removed", timeout=10)
    await asyncio.sleep(0.2)
    assert _left() == [".owner"]
    assert len(submitted) == 1


async def test_a_run_given_up_while_a_worker_runs_it_leaves_nothing(submitted: list[Any]) -> None:
    await offload.run(partial(os.getpid))
    run = asyncio.ensure_future(offload.run(partial(time.sleep, 1.0)))
    await eventually_async(_left, accept=lambda left: [name.rsplit(".", 1)[-1] for name in left] == ["owner", "answer"],
                           what="the work taken by a worker", timeout=10)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await offload.run(partial(time.sleep, 1.1), light=True)  # the given-up work ended meanwhile
    await eventually_async(_left, accept=lambda left: left == [".owner"], what="the files removed", timeout=10)


async def test_a_trip_that_cannot_be_written_goes_by_the_pipes(submitted: list[Any], monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    await offload.run(partial(os.getpid))  # the folder is made

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(tempfile, "mkstemp", full)
    work = partial(sorted, [2, 1])
    assert await offload.run(work) == [1, 2]
    assert submitted[-1] is work
    assert "No space left on device" in caplog.text


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder of its own in /dev/shm, standing for it."""
    path = Path(tempfile.mkdtemp(dir="/dev/shm"))
    monkeypatch.setattr(trip_files, "MEMORY", path)
    monkeypatch.setattr(trip_files, "ROOM", 0)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_only_folders_whose_owner_is_gone_are_removed(memory: Path) -> None:
    tmp_path = memory
    dead, live = tmp_path / "agent-world-trips-dead", tmp_path / "agent-world-trips-live"
    for path in (dead, live):
        path.mkdir()
        (path / ".owner").touch()
        (path / "x.work").write_bytes(b"a secret")
    held = os.open(live / ".owner", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # as its live process holds it
    odd = [tmp_path / "agent-world-trips-²", tmp_path / "agent-world-trips-2147483648-x"]
    for path in odd:
        path.mkdir()  # no owner file: left alone, and no error
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".owner").touch()
    (tmp_path / "agent-world-trips-link").symlink_to(elsewhere)  # not followed
    trips = trip_files.Folder()
    try:
        made = trips.get()
        assert made is not None and made.parent == memory and made.stat().st_mode & 0o777 == 0o700
        assert not dead.exists()
        assert live.exists() and all(path.exists() for path in odd) and (elsewhere / ".owner").exists()
        assert trips.get() == made
        shutil.rmtree(made)  # e.g. systemd removes a user's /dev/shm files when their last session ends
        again = trips.get()
        assert again is not None and again != made and again.is_dir()
    finally:
        trips.remove()
        os.close(held)
    assert not again.exists()


def test_memory_on_a_disk_is_not_used(memory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work may carry the secrets redaction looks for: never written to a disk."""
    trips = trip_files.Folder()
    assert trips.get() is not None
    trips.remove()
    disk = Path(tempfile.mkdtemp(dir=Path(__file__).parent))  # the checkout's disk, not a tmpfs
    monkeypatch.setattr(trip_files, "MEMORY", disk)
    try:
        assert trips.get() is None and list(disk.iterdir()) == []
    finally:
        shutil.rmtree(disk)
