"""The engine observes every event once: a change this process wrote drops the memoized configuration as it
is written, and hearing it back on the bus does not drop it a second time (the memo just re-read stays)."""
from __future__ import annotations

from server import vocab
from tests.fixtures.engine import OWNER, Harness
from tests.fixtures.eventually import eventually_async


async def test_a_config_change_written_here_is_observed_once(harness: Harness) -> None:
    world = await harness.make_world("alice")
    worlds, store = harness.engine.worlds, harness.engine.store
    heard: list[int] = []
    store.observers.append(lambda _, event: heard.append(event["seq"]))  # told as it is written
    before = worlds._generation.get(world, 0)
    await harness.engine.update_world(world, OWNER, name="Renamed")
    seq = heard[-1]
    # The listener hears it back (from the bus) and takes it off the list of this process's writes.
    await eventually_async(lambda: seq not in store._own.get(world, set()), what="the listener heard the change")
    assert worlds._generation[world] == before + 1
    assert (await harness.engine.world_info(world))["name"] == "Renamed"


async def test_an_event_from_elsewhere_is_observed_by_the_listener(harness: Harness) -> None:
    world = await harness.make_world("alice")
    worlds, store = harness.engine.worlds, harness.engine.store
    before = worlds._generation.get(world, 0)
    # Written by "another process": straight to the log and the bus, as its Store would.
    current = await store.log.get_open(world, vocab.world_key())
    assert current is not None
    event = {"kind": vocab.WORLD_UPDATED, "sender": OWNER.sender, "name": "From elsewhere",
             "settings": current["settings"]}
    other = type(store)(store.log, store.bus)
    await other.append(world, event, [])
    await eventually_async(lambda: worlds._generation.get(world, 0) == before + 1, what="the memo dropped")
