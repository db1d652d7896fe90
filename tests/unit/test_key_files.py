"""Keys and sealed records written in the data folder: whole or not at all, whoever writes at once."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from server.key_files import read_or_make
from server.tools.mcp.oauth_vault import FOLDER, FileVault


def test_a_key_that_could_not_be_made_leaves_no_empty_key_behind(tmp_path: Path) -> None:
    def fail() -> bytes:
        raise OSError("no entropy")  # as a crash between creating the file and writing it
    with pytest.raises(OSError):
        read_or_make(tmp_path / "the.key", fail)
    assert list(tmp_path.iterdir()) == []
    assert read_or_make(tmp_path / "the.key", lambda: b"made") == b"made"
    assert read_or_make(tmp_path / "the.key", lambda: b"another") == b"made"  # made once
    assert [p.name for p in tmp_path.iterdir()] == ["the.key"]


async def test_saves_of_one_record_at_once_each_write_a_whole_record(tmp_path: Path) -> None:
    vault = FileVault(tmp_path)
    records = [{"n": n, "pad": "x" * 50_000} for n in range(40)]
    await asyncio.gather(*(vault.save("w", "s", record) for record in records))
    assert await vault.load("w", "s") in records
    assert [p.name for p in (tmp_path / FOLDER).iterdir() if p.name.startswith(".")] == []
