"""Issue #11 fault 5: a full disk, simulated with a small tmpfs under a real `agent-world serve`.

Mounting needs root (CI runs as root); without it these tests fail, they never skip.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from server.backends import SQLITE_FILE
from server.testing.openai_double import OpenAIDouble
from tests.fixtures.api import all_events, error_of, make_world, wait_until
from tests.fixtures.engine import run_on_request
from tests.fixtures.server import ROOT, free_port, start_server


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs: a disk that a shell command can fill."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"these tests mount a small tmpfs and need root: {mounted.stderr.strip()}", pytrace=False)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(path: Path) -> None:
    """Write zeros to `path` until the disk is full (unbuffered: closing it has nothing left to write)."""
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def _status(owner: httpx.Client, world: str) -> dict[str, Any]:
    status: dict[str, Any] = owner.get(f"/api/worlds/{world}").json()["status"]["alice"]
    return status


def test_a_result_that_meets_a_full_disk_is_kept_and_stored_once_there_is_room(
        small_disk: Path, llm_double: OpenAIDouble) -> None:
    server = start_server(small_disk / "data", llm=llm_double)
    try:
        llm_double.respond_with(run_on_request)
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=10) as owner:
            world = make_world(owner, llm_double)
            fill = small_disk / "fill"
            # 60 KB of output, written after the tool has (slowly) filled nothing itself: the test fills the disk.
            owner.post(f"/api/worlds/{world}/messages", json={
                "content": "run touch started; sleep 1.5; head -c 60000 /dev/zero | tr '\\0' x; echo; echo finished"})
            approval = wait_until(lambda: owner.get(f"/api/worlds/{world}/approvals/pending").json(),
                                  what="a pending approval")[0]
            decision = {"role": "tool", "tool_call_id": approval["id"],
                        "content": json.dumps({"decision": "approve", "scope": "once"})}
            assert owner.post(f"/api/worlds/{world}/tool-results", json=decision).status_code == 201
            # Once it runs (its start on the record: a start that meets the full disk waits, and says so):
            wait_until(lambda: list((small_disk / "data").rglob("started")), what="the command running")
            # While the tool sleeps: empty the WAL (so the result must grow it) and fill the disk.
            db = sqlite3.connect(small_disk / "data" / SQLITE_FILE)
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            db.close()
            _fill(fill)
            state = wait_until(lambda: (s := _status(owner, world)).get("last_error") and s, timeout=15,
                               what="the status to say the result waits")
            assert state["state"] == "running_tool" and "could not be stored" in state["last_error"], state
            assert "disk is full" in state["last_error"], state
            refused = owner.post(f"/api/worlds/{world}/messages", json={"content": "z" * 90_000})
            assert refused.status_code == 503 and error_of(refused) == "storage_unavailable", refused.text
            assert "disk is full" in refused.json()["error"]["message"]
            fill.unlink()  # room again: the kept result is stored, then the turn goes on
            freed = time.monotonic()
            result = wait_until(lambda: [e for e in all_events(owner, world) if e.get("role") == "tool"
                                         and not e.get("decision") and "finished" in (e.get("content") or "")],
                                timeout=20, what="the tool's result")
            print(f"the kept result was stored {time.monotonic() - freed:.2f} s after space was freed")
            assert len(result) == 1 and "interrupted" not in result[0]["content"]
            wait_until(lambda: any(e.get("content") == "done" for e in all_events(owner, world)),
                       what="alice's answer to the result")
        log = server.log()
        assert "disk is full" in log and "cannot rollback" not in log
    finally:
        server.stop()


def _serve(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "server.cli", "serve", "--port", str(free_port()), "--no-demo",
                           "--data-dir", str(data_dir)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "AGENT_WORLD_TOKEN": "t" * 40, "HOME": str(data_dir.parent)})


def test_start_on_a_full_or_read_only_data_folder_fails_in_one_line(small_disk: Path,
                                                                     llm_double: OpenAIDouble) -> None:
    data = small_disk / "data"
    start_server(data, llm=llm_double).stop()  # a data folder with a log in it
    _fill(small_disk / "fill")
    full = _serve(data)
    assert full.returncode == 1 and full.stdout == "", (full.stdout, full.stderr)
    assert full.stderr.count("\n") == 1 and full.stderr.startswith("agent-world: error: "), full.stderr
    assert "No space left on device" in full.stderr
    (small_disk / "fill").unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    read_only = _serve(data)
    assert read_only.returncode == 1 and read_only.stdout == "", (read_only.stdout, read_only.stderr)
    assert read_only.stderr.count("\n") == 1 and "Read-only file system" in read_only.stderr, read_only.stderr
