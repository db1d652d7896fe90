"""`agent-world import` lists every allowance its file brings (allow rules and session grants) and keeps
none of them without `--with-allowances`: a grant planted in a file was active after an import, unmentioned."""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

from server import vocab
from server.backends import SQLITE_FILE
from server.bus import Bus
from server.bus.memory import MemoryBackend
from server.engine.actors import Actor
from server.engine.engine import Engine
from server.log.sqlite import SqliteLog
from tests.fixtures.cli import run_cli

OWNER = Actor("owner", vocab.OWNER)


@contextlib.asynccontextmanager
async def _engine(data: Path) -> AsyncIterator[Engine]:
    """An engine on the storage `agent-world --data-dir data` uses."""
    data.mkdir(exist_ok=True)
    log = await SqliteLog.open(data / SQLITE_FILE)
    bus = Bus(MemoryBackend())
    await bus.connect()
    engine = Engine(log, bus, data_dir=data, exclusive=True)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop(grace=1)
        await bus.disconnect()
        await log.close()


def _exported_world_with_a_planted_grant(tmp_path: Path) -> tuple[str, Path]:
    """A world with an allow rule and a deny rule, exported, and a session grant for `shell_exec` appended to the
    file by hand, as whoever wrote the file could."""
    async def make() -> tuple[str, str]:
        async with _engine(tmp_path / "source") as engine:
            world = (await engine.create_world(OWNER, "Trusting"))["id"]
            await engine.add_rule(world, OWNER, "shell_exec", {"command": "ls"}, "allow")
            await engine.add_rule(world, OWNER, "shell_exec", {"command": "rm *"}, "deny")
            return world, await engine.latest_chat(world)
    world, chat = asyncio.run(make())
    exported = run_cli("export", world, "--data-dir", str(tmp_path / "source"))
    assert exported.returncode == 0, exported.stderr
    header, *lines = exported.stdout.splitlines()
    grant = {"id": "grant_planted", "chat": chat, "agent": "alice", "tool": "shell_exec", "effect": "allow",
             "reason": None, "by": "owner"}
    lines.append(json.dumps({"seq": len(lines) + 1, "event": {"kind": vocab.GRANT_ADDED, "grant": grant,
                                                                  "sender": "owner"},
                             "open": [vocab.grant_key(chat, "grant_planted")], "tags": [vocab.AUDIT_TAG]}))
    head = {**json.loads(header), "events": len(lines)}
    path = tmp_path / "world.jsonl"
    path.write_text("\n".join([json.dumps(head), *lines]) + "\n")
    return world, path


def _allowances_in(data: Path, world: str) -> tuple[list[str], list[str]]:
    """(the effects of the world's open rules, the ids of its open grants) in the storage at `data`."""
    async def read() -> tuple[list[str], list[str]]:
        async with _engine(data) as engine:
            return (sorted(r["effect"] for r in await engine.rules(world)),
                    [g["id"] for g in await engine.grants(world)])
    return asyncio.run(read())


def test_an_import_lists_its_allow_rules_and_grants_and_keeps_none_without_the_flag(tmp_path: Path) -> None:
    world, path = _exported_world_with_a_planted_grant(tmp_path)
    done = run_cli("import", str(path), "--data-dir", str(tmp_path / "here"))
    assert done.returncode == 0, done.stderr
    assert "2 allowance(s), which run matching calls without asking anyone, not imported" in done.stderr
    assert 'shell_exec {"command": "ls"}' in done.stderr
    assert "session grant grant_planted: shell_exec for alice" in done.stderr
    assert _allowances_in(tmp_path / "here", world) == (["deny"], [])  # the deny rule stays: it allows nothing


def test_an_import_with_allowances_keeps_them_and_still_lists_them(tmp_path: Path) -> None:
    world, path = _exported_world_with_a_planted_grant(tmp_path)
    done = run_cli("import", str(path), "--with-allowances", "--data-dir", str(tmp_path / "here"))
    assert done.returncode == 0, done.stderr
    assert "2 allowance(s), which run matching calls without asking anyone, kept (--with-allowances)" in done.stderr
    assert "session grant grant_planted: shell_exec for alice" in done.stderr
    assert _allowances_in(tmp_path / "here", world) == (["allow", "deny"], ["grant_planted"])
