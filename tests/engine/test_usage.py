"""Token usage: summed per agent and per world from the replies in the log, kept current from events."""
from __future__ import annotations

from typing import Any

from server.engine.world.usage import Usage
from server.metrics import Metrics
from server.testing.openai_double import Text
from tests.fixtures.engine import Harness
from tests.fixtures.eventually import eventually_async


def _expected(events: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    sums: dict[str, dict[str, int]] = {}
    for event in events:
        if event.get("role") == "assistant" and event.get("usage") and event.get("sender") == event.get("agent"):
            tally = sums.setdefault(event["agent"], {"prompt_tokens": 0, "completion_tokens": 0,
                                                     "total_tokens": 0, "replies": 0})
            for kind in ("prompt_tokens", "completion_tokens", "total_tokens"):
                tally[kind] += event["usage"][kind]
            tally["replies"] += 1
    return sums


def _count_reads(harness: Harness) -> tuple[Any, list[tuple[Any, ...]]]:
    """Count the usage book's reads of the log (the same log, seen through a counter); returns the log."""
    log = harness.engine.usage.log
    reads: list[tuple[Any, ...]] = []

    class Counted:
        def __getattr__(self, name: str) -> Any:
            return getattr(log, name)

        async def read(self, *args: Any) -> Any:
            reads.append(args)
            return await log.read(*args)

        async def worlds(self) -> Any:
            reads.append(("worlds",))
            return await log.worlds()
    harness.engine.usage.log = Counted()  # type: ignore[assignment]
    return log, reads


async def _caught_up(harness: Harness, agents: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The engine's sums once its listener has handled every reply (it hears them by the bus)."""
    return await eventually_async(lambda: harness.engine.usage.of(harness.world), what=f"usage {agents}",
                                  accept=lambda usage: usage["agents"] == agents)


async def test_tokens_are_summed_per_agent_and_per_world_from_the_log(harness: Harness) -> None:
    await harness.make_world("alice", "bob")
    harness.double.respond_with(lambda body: Text("a reply of a few words"))
    await harness.say("hello both")
    await harness.idle()
    expected = _expected(await harness.events())
    assert set(expected) == {"alice", "bob"} and all(t["total_tokens"] > 0 for t in expected.values())
    usage = await _caught_up(harness, expected)
    assert usage["world"] == {kind: sum(t[kind] for t in expected.values()) for kind in expected["alice"]}

    # Read once: later replies are added from the events the engine handles, not by reading the log again.
    log, reads = _count_reads(harness)
    await harness.say("@alice again")
    await harness.idle()
    expected = _expected(await harness.events())
    assert expected["alice"]["replies"] == 2 and expected["bob"]["replies"] == 1
    await _caught_up(harness, expected)
    assert reads == []
    harness.engine.usage.log = log

    # One source of truth: a process that starts now sums the same from the log alone.
    fresh = await Usage(harness.engine.store.log, Metrics()).of(harness.world)
    assert fresh == await harness.engine.usage.of(harness.world)


def _lines(world: str, agent: str, tally: dict[str, int]) -> list[str]:
    return [f'agent_world_tokens{{agent="{agent}",kind="{kind}",world="{world}"}} {tally[kind + "_tokens"]}.0'
            for kind in ("prompt", "completion", "total")]


async def _until_rendered(harness: Harness, lines: list[str], present: bool = True) -> None:
    await eventually_async(lambda: harness.engine.metrics.render().decode(), what=f"{lines} present={present}",
                           accept=lambda text: all((line in text) == present for line in lines))


async def test_metrics_show_each_agents_tokens_and_a_scrape_reads_nothing_after_the_first(harness: Harness) -> None:
    from tests.fixtures.engine import OWNER
    first = await harness.make_world("alice")
    harness.double.respond_with(lambda body: Text("hi"))
    await harness.say("hello")
    await harness.idle()
    expected = _expected(await harness.events())["alice"]
    await harness.engine.usage.refresh_metrics()
    await _until_rendered(harness, _lines(first, "alice", expected))

    # Later scrapes read nothing; a world created since is summed from the events the engine hears.
    log, reads = _count_reads(harness)
    second = await harness.make_world("bob")
    await harness.say("hello bob")
    await harness.idle()
    await harness.engine.usage.refresh_metrics()
    await _until_rendered(harness, _lines(second, "bob", _expected(await harness.events())["bob"]))
    assert [args for args in reads if args[0] != second] == []  # the new world's own log, read once at most

    await harness.engine.worlds.delete(first, OWNER)
    await _until_rendered(harness, _lines(first, "alice", expected), present=False)
    harness.engine.usage.log = log
