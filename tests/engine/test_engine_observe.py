"""The engine observes every event once: a change this process wrote drops the memoized configuration as it
is written, and hearing it back on the bus does not drop it a second time (the memo just re-read stays)."""
from __future__ import annotations

from typing import Any

import pytest

from server import vocab
from server.log.failures import StorageError
from tests.fixtures.engine import OWNER, Harness
from tests.fixtures.eventually import eventually_async


async def test_a_config_change_written_here_is_observed_once(harness: Harness) -> None:
    world = await harness.make_world("alice")
    worlds, store = harness.engine.worlds, harness.engine.store
    heard: list[int] = []
    store.observers.append(lambda _, event: heard.append(event["seq"]))  # told as it is written
    before = worlds._generation  # (counts the forgets of every world: one world here)
    await harness.engine.update_world(world, OWNER, name="Renamed")
    seq = heard[-1]
    # The listener hears it back (from the bus) and takes it off the list of this process's writes.
    await eventually_async(lambda: seq not in store._own.get(world, set()), what="the listener heard the change")
    assert worlds._generation == before + 1
    assert (await harness.engine.world_info(world))["name"] == "Renamed"


async def test_an_event_from_elsewhere_is_observed_by_the_listener(harness: Harness) -> None:
    world = await harness.make_world("alice")
    worlds, store = harness.engine.worlds, harness.engine.store
    before = worlds._generation  # (counts the forgets of every world: one world here)
    # Written by "another process": straight to the log and the bus, as its Store would.
    current = await store.log.get_open(world, vocab.world_key())
    assert current is not None
    event = {"kind": vocab.WORLD_UPDATED, "sender": OWNER.sender, "name": "From elsewhere",
             "settings": current["settings"]}
    other = type(store)(store.log, store.bus)
    await other.append(world, event, [])
    await eventually_async(lambda: worlds._generation == before + 1, what="the memo dropped")


async def test_a_settings_change_whose_reading_the_log_refused_once_still_reaches_the_tools(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener heard a world's settings change, then reading the new settings failed (a full disk,
    Redis gone a moment): the event was already marked handled, so catching up after the error skipped
    it, and the world's tools kept the old settings (MCP servers, sandbox) until a restart."""
    world = await harness.make_world("alice")
    worlds = harness.engine.worlds
    refused: list[str] = []
    settings = worlds.settings

    async def refusing_once(name: str) -> dict[str, Any]:
        if not refused:
            refused.append(name)
            raise StorageError("database or disk is full")
        return await settings(name)
    monkeypatch.setattr(worlds, "settings", refusing_once)
    await harness.engine.update_world(world, OWNER, settings={"mcp_timeout": 7})
    await eventually_async(lambda: harness.engine.world_tools._settings.get(world, {}).get("mcp_timeout") == 7,
                           timeout=5, what="the tools' settings updated")
    assert refused
