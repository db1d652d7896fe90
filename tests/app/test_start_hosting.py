"""A restart costs the same whatever the work (issue #30): the server answers as soon as it follows new
worlds, and hosts the worlds with work after that, in the background."""
from __future__ import annotations

import asyncio
import base64
import os
import secrets
import threading
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from server.app import ServerConfig, create_app
from server.backends import open_backends
from server.engine.engine import Engine
from server.engine.hosting.hosted import Hosting
from server.testing.openai_double import OpenAIDouble, Text
from server.tools.mcp.oauth_vault import KEY_FILE, FileVault
from tests.fixtures.engine import MEMBER, OWNER, reply_by_turn, tool_calls
from tests.fixtures.eventually import eventually, eventually_async


async def _world_with_a_pending_request(data_dir: Path, double: OpenAIDouble) -> str:
    double.respond_with(reply_by_turn(lambda: tool_calls(("shell_exec", {"command": "true"})), after_tools=Text("ok")))
    log, bus = await open_backends(data_dir=data_dir, redis_url=None)  # the server's own files
    engine = Engine(log, bus, data_dir=data_dir, exclusive=True)
    await engine.start()
    try:
        agent = {"name": "alice", "provider": "openai", "model": "m", "base_url": double.base_url}
        world: str = (await engine.create_world(OWNER, "Busy", agents=[agent]))["id"]
        await engine.post_message(world, MEMBER, "go")
        await eventually_async(lambda: engine.pending_approvals(world), timeout=10, what="a pending request")
        return world
    finally:
        await engine.stop(grace=1)
        await bus.disconnect()
        await log.close()


def test_the_server_answers_before_its_worlds_with_work_are_hosted(
        tmp_path: Path, llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = tmp_path
    world = asyncio.run(_world_with_a_pending_request(data_dir, llm_double))
    release = threading.Event()
    threading.Timer(60, release.set).start()  # on code that waits for the hosting, the start ends then, hosted
    host = Hosting.host

    async def held(self: Hosting, name: str) -> None:
        await asyncio.to_thread(release.wait)
        await host(self, name)
    monkeypatch.setattr(Hosting, "host", held)
    token = secrets.token_urlsafe(32)
    app = create_app(ServerConfig(data_dir=data_dir, token=token, demo=False))
    try:
        with TestClient(app) as client:
            engine: Any = app.state.ctx.engine
            assert client.get("/healthz").status_code == 200
            assert not engine.hosts(world)
            release.set()
            eventually(lambda: engine.hosts(world), timeout=10, what="the world with work hosted")
    finally:
        release.set()


def _log_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(("sqlite-log", "sqlite-read", "sqlite-checkpoint"))}


def test_a_start_that_fails_late_stops_what_it_started(tmp_path: Path) -> None:
    # The push key is read after the engine and the log have started: a start that fails there stops them
    # (the log's threads end), and a second start in the same process finds the data folder free.
    (tmp_path / "vapid.pem").write_bytes(b"not a key")
    token = secrets.token_urlsafe(32)
    before = _log_threads()
    with pytest.raises(ValueError, match="does not hold a VAPID key"), \
            TestClient(create_app(ServerConfig(data_dir=tmp_path, token=token, demo=False))):
        pass
    eventually(lambda: not _log_threads() - before, timeout=10, what="the failed start's log closed")
    (tmp_path / "vapid.pem").unlink()
    with TestClient(create_app(ServerConfig(data_dir=tmp_path, token=token, demo=False))) as client:
        assert client.get("/healthz").status_code == 200


def test_a_start_that_fails_before_the_engine_starts_stops_what_it_started(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE).mkdir()  # the kept OAuth key cannot be read: the given key's start fails there
    key = base64.b64encode(os.urandom(32)).decode()
    before = _log_threads()
    with pytest.raises(IsADirectoryError), TestClient(create_app(ServerConfig(
            data_dir=tmp_path, token=secrets.token_urlsafe(32), demo=False, mcp_oauth_key=key))):
        pass
    eventually(lambda: not _log_threads() - before, timeout=10, what="the failed start's log closed")


def test_the_oauth_key_the_operator_gives_seals_the_sign_ins_and_is_kept_nowhere(tmp_path: Path) -> None:
    earlier = {"url": "https://old.example/mcp", "tokens": {"access_token": "b" * 40}}
    asyncio.run(FileVault(tmp_path).save("world", "old", earlier))  # signed in before a key was given
    key = base64.b64encode(os.urandom(32)).decode()
    app = create_app(ServerConfig(data_dir=tmp_path, token=secrets.token_urlsafe(32), demo=False, mcp_oauth_key=key))
    record = {"url": "https://mcp.example/mcp", "tokens": {"access_token": "a" * 40}}
    with TestClient(app) as client:
        vault = app.state.ctx.engine.mcp_sign_ins.vault
        client.portal.call(vault.save, "world", "sec", record)  # type: ignore[union-attr]
    assert not (tmp_path / KEY_FILE).exists()
    given = FileVault(tmp_path, base64.b64decode(key))
    assert asyncio.run(given.load("world", "sec")) == record
    assert asyncio.run(given.load("world", "old")) == earlier  # sealed again under the given key at start
