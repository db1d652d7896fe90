"""The world a fresh server starts with, so there is something alive to look at."""
from __future__ import annotations

import os

from . import events
from .engine.actors import SYSTEM
from .engine.engine import Engine

NOTES = """# Notes

- The demo agents are scripted: they run offline, with no API key.
- alice runs `ls -la` (a shell command: it needs your approval), then asks bob to read this file.
- bob reads it (read-only: no approval), shows you a notification in the browser, and answers.
"""


async def ensure_demo_world(engine: Engine) -> str | None:
    """Create the demo world when the server has none; returns its id if it was created."""
    if (await engine.worlds.page(limit=1))[0]:
        return None
    offline = not os.environ.get("OPENAI_API_KEY")
    provider = {"provider": "scripted", "model": "demo"} if offline else {"provider": "openai", "model": "gpt-4o-mini"}
    world = await engine.create_world(SYSTEM, "Demo", agents=[
        {"name": "alice", "system_prompt": "You are alice, a careful engineer. Work in the shared workspace; "
                                           "ask @bob for help when useful.", **provider},
        {"name": "bob", "system_prompt": "You are bob, a helpful reviewer. Read files before answering.",
         **provider},
    ])
    (engine.workspace_for(world["id"]) / "notes.md").write_text(NOTES)
    await engine.store.append(world["id"], events.notice("main", None, (
        "Welcome! Say hello to the agents: alice will ask to run a shell command — approve or deny it."
        + (" (Offline demo: the agents are scripted.)" if offline else ""))))
    return str(world["id"])
