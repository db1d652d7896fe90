"""What is particular to the SQLite log: its write-ahead log stays short (copied back when appends
pause, bounded under load), reads run beside appends, and a large body is written in pieces that
other appends come between."""
from __future__ import annotations

import asyncio
import itertools
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from server.log.base import Conflict, Open, Tag
from server.log.failures import StorageError
from server.log.sqlite import SqliteLog
from tests.fixtures.eventually import eventually_async

BODY = {"kind": "message", "ts": "2026-11-01T00:00:00Z", "content": "x" * 500}


async def _append_for(log: SqliteLog, seconds: float, at_least: int = 20) -> int:
    # (`at_least`: a loaded machine may pause this process past the deadline before the first append)
    deadline, count = time.monotonic() + seconds, 0
    while count < at_least or time.monotonic() < deadline:
        await log.append("w", dict(BODY), [Tag("mem:main:alice")])
        count += 1
    return count


async def test_steady_appends_never_let_the_wal_pass_its_cap_by_much(tmp_path: Path) -> None:
    """It holds on a loaded machine too (it failed there: 27 MB with a 1 MB cap): see the CPU-hog test."""
    cap = 1024 * 1024
    # checkpoint_idle longer than the run: only the cap can bring the WAL back
    log = await SqliteLog.open(tmp_path / "log.sqlite3", checkpoint_idle=60, wal_cap=cap)
    try:
        sizes: list[int] = []

        async def watch() -> None:
            while True:
                sizes.append(log.wal_bytes)
                await asyncio.sleep(0.005)
        watcher = asyncio.create_task(watch())
        appended = await _append_for(log, 3.0)
        watcher.cancel()
        restarts = sum(1 for before, after in itertools.pairwise(sizes) if after < before)
        assert restarts >= 2, f"the WAL was never started over ({appended} appends, sizes up to {max(sizes)})"
        # the cap is looked at every few appends; past twice the cap the writer checkpoints itself
        assert max(sizes) < 3 * cap, f"WAL reached {max(sizes)} bytes with a cap of {cap}"
        assert [e["seq"] for e in await log.read("w", limit=100_000)] == list(range(1, appended + 1))
    finally:
        await log.close()


async def test_the_wal_is_copied_back_once_appends_pause(tmp_path: Path) -> None:
    log = await SqliteLog.open(tmp_path / "log.sqlite3", checkpoint_idle=0.2)
    try:
        appended = await _append_for(log, 0.5)
        grown = log.wal_bytes
        assert grown > 0
        # Idle: a passive checkpoint copies everything back (within about 0.3 s; waited for with room to
        # spare on a loaded machine, where it failed with 0.6 s).
        await asyncio.sleep(1.5)
        await log.append("w", dict(BODY))  # the next append restarts the WAL from its start
        assert log.wal_bytes <= grown
        # A quarter of as many (by count: appends timed apart may write more on a machine less busy). A pause
        # on a loaded machine may have started the WAL over during the first ones: its file is then as long
        # as their longest run between two restarts, a third of them or more with up to two restarts.
        for _ in range(appended // 4):
            await log.append("w", dict(BODY), [Tag("mem:main:alice")])
        assert log.wal_bytes <= grown  # written over from the start, not grown
    finally:
        await log.close()


async def test_an_append_does_not_wait_for_a_long_read(tmp_path: Path) -> None:
    log = await SqliteLog.open(tmp_path / "log.sqlite3")
    try:
        for _ in range(20):
            await log.append_batch("w", [(dict(BODY), ()) for _ in range(2000)])
        finished: list[str] = []

        async def replay() -> None:  # a spectator reading 40,000 events, some tens of milliseconds
            assert len(await log.read("w", limit=100_000)) >= 40_000
            finished.append("read")

        async def append() -> None:
            await log.append("w", dict(BODY))
            finished.append("append")
        reading = asyncio.create_task(replay())
        await asyncio.sleep(0)  # the read is handed to SQLite first
        await asyncio.gather(append(), reading)
        assert finished == ["append", "read"]
        assert (await log.read("w", after=40_000))[0]["seq"] == 40_001
    finally:
        await log.close()


async def test_the_wal_stays_bounded_beside_a_cpu_hog(tmp_path: Path) -> None:
    """Two processes spinning on this 2-core machine starve the background checkpoint: the writer must
    still keep the WAL bounded."""
    import multiprocessing

    hogs = [multiprocessing.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(2)]
    for hog in hogs:
        hog.start()
    try:
        await test_steady_appends_never_let_the_wal_pass_its_cap_by_much(tmp_path)
    finally:
        for hog in hogs:
            hog.terminate()
            hog.join(5)


def _spin() -> None:
    while True:
        pass


# -- bodies in pieces -------------------------------------------------------------------------------

def _pieces_in(path: Path) -> int:
    """How many pieces the file holds that no event names (read as another process would)."""
    with closing(sqlite3.connect(path)) as db:
        count: int = db.execute("SELECT count(*) FROM pieces WHERE blob NOT IN (SELECT blob FROM pieced)").fetchone()[0]
        return count


def _large(text: str) -> dict[str, object]:
    return {**BODY, "content": text}


async def test_other_worlds_append_between_the_pieces_of_a_large_body(tmp_path: Path) -> None:
    """One transaction for a 16 MiB body held SQLite's one writer for 32 ms; in pieces, it holds it for one."""
    path = tmp_path / "log.sqlite3"
    log = await SqliteLog.open(path, piece_bytes=256)
    try:
        text = "".join(f"line {i:07d}\n" for i in range(70_000))  # 910 KB: thousands of pieces
        large = asyncio.create_task(log.append("a", _large(text)))
        await eventually_async(lambda: asyncio.to_thread(_pieces_in, path), what="the first pieces")
        small = await log.append("b", dict(BODY))
        assert not large.done(), "world b's append waited for world a's whole body"
        assert small["seq"] == 1
        assert (await large)["seq"] == 1
        assert [e["content"] for e in await log.read("a")] == [text]
    finally:
        await log.close()


async def test_a_body_in_pieces_reads_back_whole_and_is_searched_across_its_seams(tmp_path: Path) -> None:
    log = await SqliteLog.open(tmp_path / "log.sqlite3", piece_bytes=4096)
    try:
        # "needle" starting at every offset around the first seam (the body's JSON starts 57 bytes before
        # the content), and in a small event after it
        for offset in range(4080, 4100):
            await log.append("w", _large("x" * (offset - 57) + "needle" + "y" * 20_000), [Tag("t")])
        await log.append("w", _large("small needle"), [Open("call:1"), Tag("t")])
        read = await log.read("w")
        assert [len(e["content"]) for e in read] == [offset - 57 + 6 + 20_000 for offset in range(4080, 4100)] + [12]
        assert await log.read_tagged("w", ["t"]) == read
        assert [e["seq"] for e in await log.search("w", "NEEDLE")] == list(range(21, 0, -1))
        assert await log.search("w", "needlex") == []
        assert [e["seq"] for e in await log.list_open("w", "call:")] == [21]
    finally:
        await log.close()


async def test_a_search_step_counts_a_body_in_pieces_at_its_size(tmp_path: Path) -> None:
    log = await SqliteLog.open(tmp_path / "log.sqlite3", piece_bytes=4096)
    try:
        await log.append("w", _large("small 1"))
        await log.append("w", _large("z" * 100_000))  # 2: in pieces, its row's body empty
        await log.append("w", _large("small 3"))
        log.search_step_bytes = 50_000
        assert (await log.search_between("w", "small", 0, 3))[1] == 2  # the step stopped above event 2
    finally:
        await log.close()


async def test_a_failed_append_leaves_no_pieces_behind(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite3"
    log = await SqliteLog.open(path, piece_bytes=4096)
    try:
        await log.append("w", dict(BODY), [Open("call:1")])
        with pytest.raises(Conflict):
            await log.append("w", _large("z" * 100_000), [Open("call:1", new=True)])
        await log.append("w", dict(BODY))  # after the failed append's clean-up, on the one writer thread
        assert await asyncio.to_thread(_pieces_in, path) == 0
        assert [e["seq"] for e in await log.read("w")] == [1, 2]
    finally:
        await log.close()


_KILLED_MID_APPEND = """
import asyncio, sys
from server.log.sqlite import SqliteLog

async def main() -> None:
    log = await SqliteLog.open(sys.argv[1], piece_bytes=16)
    await log.append("w", {"kind": "message", "content": "z" * 500_000})  # some 30,000 pieces

asyncio.run(main())
"""


async def test_pieces_of_a_process_killed_mid_append_are_swept_and_a_live_writers_kept(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite3"
    await (await SqliteLog.open(path)).close()  # the file, made
    writer = subprocess.Popen([sys.executable, "-c", _KILLED_MID_APPEND, str(path)], cwd=Path(__file__).parents[2])
    try:
        await eventually_async(lambda: asyncio.to_thread(_pieces_in, path), timeout=60, what="the first pieces")
        # Opened while another process writes pieces: the sweep keeps pieces younger than its age.
        beside = await SqliteLog.open(path)
        await beside.close()
        assert await asyncio.to_thread(_pieces_in, path) > 0
    finally:
        writer.kill()
        writer.wait()
    log = await SqliteLog.open(path, orphan_age=0)  # that process is gone: its pieces are swept at once
    try:
        assert await asyncio.to_thread(_pieces_in, path) == 0
        assert await log.read("w") == []
    finally:
        await log.close()


async def test_an_append_whose_pieces_were_swept_meanwhile_fails_and_stores_nothing(tmp_path: Path) -> None:
    """Another process's sweep takes pieces pending for longer than its age: a writer stopped that long
    (or a clock stepped forward) must not write an event whose body is gone."""
    path = tmp_path / "log.sqlite3"
    log = await SqliteLog.open(path, piece_bytes=256)
    try:
        large = asyncio.create_task(log.append("a", _large("z" * 900_000)))
        await eventually_async(lambda: asyncio.to_thread(_pieces_in, path), what="the first pieces")
        await (await SqliteLog.open(path, orphan_age=0)).close()  # its sweep, at open, takes them all
        with pytest.raises(StorageError, match=r"pieces .* were lost"):
            await large
        await log.append("a", dict(BODY))
        assert [e["seq"] for e in await log.read("a")] == [1]
        assert await asyncio.to_thread(_pieces_in, path) == 0
    finally:
        await log.close()


async def test_a_long_read_does_not_hold_another_world_s_quick_reads(tmp_path: Path) -> None:
    """One world's long read (a replay; here held on purpose) does not hold another world's quick reads (by
    key: what deciding an approval reads) behind it: they have a reader of their own. Before, the log had
    one reader thread, and they waited for it."""
    log = await SqliteLog.open(tmp_path / "log.sqlite3")
    started, release = threading.Event(), threading.Event()

    def long_read(db: sqlite3.Connection) -> bool:
        started.set()
        return release.wait(30)
    try:
        await log.append("other", {"kind": "message", "content": "hello"}, [Open("call:1")])
        held = asyncio.ensure_future(log._read(long_read))
        try:
            assert await asyncio.to_thread(started.wait, 20)  # it holds a reader now
            async with asyncio.timeout(20):  # a guard: on the old code this waited for the long read
                event = await log.get_open("other", "call:1")
                assert await log.last_seq("other") == 1 and not await log.is_claimed("other", "k")
            assert event is not None and event["content"] == "hello" and not held.done()
        finally:
            release.set()
            assert await held
    finally:
        await log.close()
