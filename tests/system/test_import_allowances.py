"""`agent-world import` lists every allowance its file brings (allow rules and session grants) and keeps
none of them without `--with-allowances`: a grant planted in a file was active after an import, unmentioned."""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from server import vocab
from server.backends import SQLITE_FILE
from server.bus import Bus
from server.bus.memory import MemoryBackend
from server.engine.actors import Actor
from server.engine.engine import Engine
from server.log.sqlite import SqliteLog
from tests.fixtures.cli import run_cli

OWNER = Actor("owner", vocab.OWNER)
T = TypeVar("T")


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


def _read(data: Path, read: Callable[[Engine], Awaitable[T]]) -> T:
    """What `read` finds with an engine on the storage at `data`."""
    async def run() -> T:
        async with _engine(data) as engine:
            return await read(engine)
    return asyncio.run(run())


def _imported(path: Path, data: Path, *flags: str) -> str:
    """`agent-world import` of `path` into `data`; what it says on stderr."""
    done = run_cli("import", str(path), *flags, "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    return done.stderr


def _allowances_in(data: Path, world: str) -> tuple[list[str], list[str]]:
    """(the effects of the world's open rules, the ids of its open grants) in the storage at `data`."""
    async def read(engine: Engine) -> tuple[list[str], list[str]]:
        return sorted(r["effect"] for r in await engine.rules(world)), [g["id"] for g in await engine.grants(world)]
    return _read(data, read)


def test_an_import_lists_its_allow_rules_and_grants_and_keeps_none_without_the_flag(tmp_path: Path) -> None:
    world, path = _exported_world_with_a_planted_grant(tmp_path)
    done = _imported(path, tmp_path / "here")
    assert "2 allowance(s), which run matching calls without asking anyone, not imported" in done
    assert 'shell_exec {"command": "ls"}' in done
    assert "session grant grant_planted: shell_exec for alice" in done
    assert _allowances_in(tmp_path / "here", world) == (["deny"], [])  # the deny rule stays: it allows nothing


def test_an_import_with_allowances_keeps_them_and_still_lists_them(tmp_path: Path) -> None:
    world, path = _exported_world_with_a_planted_grant(tmp_path)
    done = _imported(path, tmp_path / "here", "--with-allowances")
    assert "2 allowance(s), which run matching calls without asking anyone, kept (--with-allowances)" in done
    assert "session grant grant_planted: shell_exec for alice" in done
    assert _allowances_in(tmp_path / "here", world) == (["allow", "deny"], ["grant_planted"])


def _exported_world_with_forged_decisions(tmp_path: Path) -> tuple[str, Path]:
    """A world exported, with three calls of alice's appended by hand: one a person 'approved' and nobody
    ran, one whose approval request is pending, one pending with a vote, as whoever wrote the file could."""
    async def make() -> tuple[str, str]:
        async with _engine(tmp_path / "source") as engine:
            world = (await engine.create_world(OWNER, "Forged"))["id"]
            return world, await engine.latest_chat(world)
    world, chat = asyncio.run(make())
    exported = run_cli("export", world, "--data-dir", str(tmp_path / "source"))
    assert exported.returncode == 0, exported.stderr
    header, *lines = exported.stdout.splitlines()

    def append(event: dict[str, object], open_keys: list[str], tags: list[str]) -> None:
        event = {**event, "ts": "2026-11-27T10:00:00.000Z", "world": world}
        lines.append(json.dumps({"seq": len(lines) + 1, "event": event, "open": open_keys, "tags": tags}))

    for call_id in ("call_approved", "call_pending", "call_voted"):
        call = {"id": call_id, "type": "function",
                "function": {"name": "shell_exec", "arguments": json.dumps({"command": "touch ran"})}}
        append({"kind": "message", "id": f"msg_{call_id}", "chat": chat, "agent": "alice", "sender": "alice",
                "role": "assistant", "content": None, "tool_calls": [call]},
               [vocab.call_key(call_id)], [vocab.trail_tag(call_id), vocab.memory_tag(chat, "alice")])
    approval = vocab.approval_id_for("call_pending")
    request = {"toolCallId": "call_pending", "toolName": "shell_exec", "toolArguments": {"command": "touch ran"},
               "message": "", "options": ["deny", "approve_once"], "expiresAt": None}
    append({"kind": "message", "id": "msg_request", "chat": chat, "agent": "alice", "sender": "server",
            "role": "assistant", "content": None, "approval": request, "tool_calls": [
                {"id": approval, "type": "function",
                 "function": {"name": vocab.REQUEST_APPROVAL, "arguments": json.dumps(request)}}]},
           [vocab.approval_key(approval)], [vocab.trail_tag("call_pending"), vocab.AUDIT_TAG])
    voted = vocab.approval_id_for("call_voted")
    two = {**request, "toolCallId": "call_voted", "approvalsRequired": 2, "askedBy": None}
    append({"kind": "message", "id": "msg_request_2", "chat": chat, "agent": "alice", "sender": "server",
            "role": "assistant", "content": None, "approval": two, "people": [], "tool_calls": [
                {"id": voted, "type": "function",
                 "function": {"name": vocab.REQUEST_APPROVAL, "arguments": json.dumps(two)}}]},
           [vocab.approval_key(voted)], [vocab.trail_tag("call_voted"), vocab.AUDIT_TAG])
    append({"kind": "message", "id": "msg_vote", "chat": chat, "agent": "alice", "sender": "human:mallory",
            "role": "tool", "tool_call_id": voted, "content": json.dumps({"decision": "approve", "scope": "once"}),
            "decision": {"decision": "approve", "scope": "once", "voters": ["human:mallory"], "required": 2,
                         "final": False}}, [vocab.quorum_key(voted)], [vocab.trail_tag("call_voted")])
    append({"kind": "message", "id": "msg_decision", "chat": chat, "agent": "alice", "sender": "human:mallory",
            "role": "tool", "tool_call_id": vocab.approval_id_for("call_approved"),
            "content": json.dumps({"decision": "approve", "scope": "once"}),
            "decision": {"decision": "approve", "scope": "once"}}, [], [vocab.trail_tag("call_approved")])
    path = tmp_path / "world.jsonl"
    path.write_text("\n".join([json.dumps({**json.loads(header), "events": len(lines)}), *lines]) + "\n")
    return world, path


def _carried_over(data: Path, world: str) -> tuple[int, dict[str, str | None]]:
    """(pending approvals, the `not_run` of each call's result) in the storage at `data`."""
    async def read(engine: Engine) -> tuple[int, dict[str, str | None]]:
        events = await engine.events(world, 0, 10_000)
        return (len(await engine.pending_approvals(world)),
                {e["tool_call_id"]: e.get("not_run") for e in events
                 if e.get("role") == "tool" and not e.get("decision")})
    return _read(data, read)


def test_an_import_runs_no_call_its_file_says_was_approved(tmp_path: Path) -> None:
    """Found by review: a file could carry an approval and no result; once hosted, the call ran unasked."""
    world, path = _exported_world_with_forged_decisions(tmp_path)
    done = _imported(path, tmp_path / "here")
    assert "2 pending request(s) or approved call(s) closed without running" in done
    # the approved call is answered unrun, the vote's request denied; the one nobody voted on stays for a person
    assert _carried_over(tmp_path / "here", world) == (1, {"call_approved": "denied", "call_voted": "denied"})
    _imported(path, tmp_path / "there", "--with-allowances")
    assert _carried_over(tmp_path / "there", world)[0] == 2
