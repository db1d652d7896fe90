"""A runner step that fails for a reason that is neither the storage's nor the LLM's (a bug) ends the turn
visibly: an `agent_error` everyone sees, the turn closed, the agent's status `error` (never "thinking" for
ever), and the trace in the log."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from server import vocab
from server.bus import Bus
from server.bus.memory import MemoryBackend
from server.engine.engine import Engine
from server.llm import Provider
from server.log.sqlite import SqliteLog
from tests.fixtures.engine import OWNER
from tests.fixtures.eventually import eventually_async


def _broken_providers(config: dict[str, Any]) -> Provider:
    raise RuntimeError(f"no provider could be built for {config['name']}")  # a bug in a provider's setup


async def test_a_step_that_fails_ends_the_turn_with_an_error_state(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    log = await SqliteLog.open(tmp_path / "log.sqlite3")
    bus = Bus(MemoryBackend())
    await bus.connect()
    engine = Engine(log, bus, data_dir=tmp_path, providers=_broken_providers, exclusive=True)
    await engine.start()
    try:
        caplog.set_level(logging.ERROR, logger="server.engine.turns.runner")
        world = (await engine.create_world(OWNER, "Broken", agents=[
            {"name": "alice", "provider": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}]))["id"]
        await engine.post_message(world, OWNER, "hello")

        async def errors() -> list[dict[str, Any]]:
            return [e for e in await engine.events(world) if e["kind"] == vocab.AGENT_ERROR]

        [error] = await eventually_async(errors, what="an agent_error")
        assert error["agent"] == "alice" and "stopped after an internal error" in error["message"]
        assert "no provider could be built for alice" in error["message"]
        status = await eventually_async(lambda: engine.status.get(world, "alice"),
                                        accept=lambda s: s["state"] == vocab.ERROR, what="status error")
        assert "no provider could be built" in status["last_error"]
        assert await engine.store.log.list_open(world, vocab.turns_of("alice")) == []
        failed = [r for r in caplog.records if "step failed" in r.getMessage()]
        assert failed and failed[0].exc_info is not None  # the trace is logged, not dropped
    finally:
        await engine.stop(grace=1)
        await bus.disconnect()
        await log.close()
