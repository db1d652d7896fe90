"""The EventLog contract, run against every implementation (SQLite and Redis, see `log_impl`).

Whatever the store, these are the semantics the engine builds on: gap-free per-world `seq`,
conditional appends that write nothing when they fail, permanent claims, tag indexes, open-item
listing by prefix, and one winner when many appends race to close the same key.
"""
from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from server import offload
from server.backends import DataDirError, open_backends
from server.bus.base import Bus
from server.bus.redis import RedisBackend
from server.log.base import Claim, Close, Conflict, EventLog, Fence, Open, Tag
from server.log.failures import StorageError
from server.log.redis.log import RedisLog
from server.log.sqlite import SqliteLog
from server.vocab import Event
from tests.fixtures.redis_servers import RedisServer
from tests.fixtures.storage import LogImpl


def ev(n: int | str, **extra: Any) -> dict[str, Any]:
    return {"kind": "message", "ts": "2026-11-01T00:00:00Z", "n": n, **extra}


async def seqs_of(log: EventLog, world: str) -> list[int]:
    return [e["seq"] for e in await log.read(world, limit=100_000)]


# -- seq --------------------------------------------------------------------------------------
async def test_seq_starts_at_one_and_counts_each_world_alone(event_log: EventLog) -> None:
    assert await event_log.last_seq("w1") == 0
    first = await event_log.append("w1", ev(1, seq=99))  # a stale seq in the input is ignored
    assert first["seq"] == 1 and first["world"] == "w1" and first["n"] == 1
    assert [(await event_log.append("w1", ev(i)))["seq"] for i in (2, 3)] == [2, 3]
    assert [(await event_log.append("w2", ev(i)))["seq"] for i in (1, 2)] == [1, 2]
    assert await event_log.last_seq("w1") == 3
    assert await event_log.last_seq("w2") == 2
    assert await event_log.last_seq("nowhere") == 0


async def test_events_round_trip_with_seq_added_on_read(event_log: EventLog) -> None:
    original = ev(1, content="héllo ☃ \"quoted\"", meta={"a": [1, 2, {"b": None}]}, ok=True)
    await event_log.append("w", original)
    assert "seq" not in original  # the caller's dict is not changed
    [stored] = await event_log.read("w")
    assert stored == {**original, "world": "w", "seq": 1}


async def test_read_after_and_limit(event_log: EventLog) -> None:
    for i in range(1, 11):
        await event_log.append("w", ev(i))
    await event_log.append("other", ev("x"))
    assert [e["n"] for e in await event_log.read("w")] == list(range(1, 11))
    assert await seqs_of(event_log, "w") == list(range(1, 11))
    assert [e["seq"] for e in await event_log.read("w", after=3, limit=4)] == [4, 5, 6, 7]
    assert [e["seq"] for e in await event_log.read("w", after=8, limit=100)] == [9, 10]
    assert await event_log.read("w", after=10) == []
    assert await event_log.read("w", after=2, limit=0) == []
    assert await event_log.read("nowhere") == []


# -- conditional appends ----------------------------------------------------------------------
async def test_open_new_conflicts_when_open_and_writes_nothing(event_log: EventLog) -> None:
    await event_log.append("w", ev(1), [Open("call:a")])
    with pytest.raises(Conflict) as err:
        await event_log.append("w", ev(2), [Tag("t"), Claim("issued:a"), Open("call:b"), Open("call:a")])
    assert (err.value.key, err.value.reason) == ("call:a", "open")
    # Nothing of the failed append exists, and its seq was not consumed.
    assert await event_log.last_seq("w") == 1
    assert await seqs_of(event_log, "w") == [1]
    assert not await event_log.is_claimed("w", "issued:a")
    assert await event_log.read_tagged("w", ["t"]) == []
    assert await event_log.get_open("w", "call:b") is None
    assert (await event_log.get_open("w", "call:a"))["seq"] == 1  # type: ignore[index]
    assert (await event_log.append("w", ev(3)))["seq"] == 2


async def test_close_must_exist_conflicts_when_not_open(event_log: EventLog) -> None:
    with pytest.raises(Conflict) as err:
        await event_log.append("w", ev(1), [Close("approval:x")])
    assert (err.value.key, err.value.reason) == ("approval:x", "closed")
    assert await event_log.last_seq("w") == 0
    assert (await event_log.append("w", ev(2), [Close("approval:x", must_exist=False)]))["seq"] == 1
    await event_log.append("w", ev(3), [Open("approval:x")])
    await event_log.append("w", ev(4), [Close("approval:x")])
    assert await event_log.get_open("w", "approval:x") is None
    with pytest.raises(Conflict):
        await event_log.append("w", ev(5), [Close("approval:x")])
    assert await event_log.last_seq("w") == 3


async def test_a_close_leaves_a_key_that_was_opened_again_after_its_seq(event_log: EventLog) -> None:
    await event_log.append("w", ev("asked"), [Open("turn:a")])
    await event_log.append("w", ev("asked again"), [Open("turn:a", new=False)])  # seq 2, after the reply's read
    await event_log.append("w", ev("reply"), [Close("turn:a", must_exist=False, unless_reopened_after=1)])
    assert (await event_log.get_open("w", "turn:a"))["n"] == "asked again"  # type: ignore[index]
    await event_log.append("w", ev("next reply"), [Close("turn:a", unless_reopened_after=3)])
    assert await event_log.get_open("w", "turn:a") is None
    with pytest.raises(Conflict) as err:  # must_exist still holds
        await event_log.append("w", ev(5), [Close("turn:a", unless_reopened_after=4)])
    assert err.value.reason == "closed"
    # Opened again by the same append, after its close: open, pointing at it.
    await event_log.append("w", ev("old"), [Open("turn:b")])
    await event_log.append("w", ev("both"), [Close("turn:b", unless_reopened_after=5), Open("turn:b")])
    await event_log.append("w", ev("then"), [Open("turn:c"), Close("turn:c", unless_reopened_after=6)])
    assert (await event_log.get_open("w", "turn:b"))["n"] == "both"  # type: ignore[index]
    assert (await event_log.get_open("w", "turn:c"))["n"] == "then"  # type: ignore[index]
    with pytest.raises(Conflict):  # what the script or the transaction saw of turn:c is what it wrote
        await event_log.append("w", ev(8), [Close("turn:c", unless_reopened_after=1), Open("turn:c", new=True)])
    assert await event_log.last_seq("w") == 7
    # Two such closes of one key in one append: the first leaves it (opened at 7), the second closes it.
    await event_log.append("w", ev("again"), [Close("turn:c", must_exist=False, unless_reopened_after=5),
                                              Close("turn:c", must_exist=False, unless_reopened_after=7),
                                              Open("turn:c", new=True)])
    assert (await event_log.get_open("w", "turn:c"))["n"] == "again"  # type: ignore[index]
    with pytest.raises(Conflict) as err:
        await event_log.append("w", ev(9), [Close("turn:c", unless_reopened_after=1),
                                            Close("turn:c", unless_reopened_after=8), Close("turn:c")])
    assert (err.value.key, err.value.reason) == ("turn:c", "closed")


async def test_open_not_new_replaces_the_pointer(event_log: EventLog) -> None:
    await event_log.append("w", ev("first"), [Open("rule:r")])
    await event_log.append("w", ev("second"), [Open("rule:r", new=False)])
    opened = await event_log.get_open("w", "rule:r")
    assert opened is not None and (opened["seq"], opened["n"]) == (2, "second")
    assert [e["n"] for e in await event_log.list_open("w", "rule:")] == ["second"]
    await event_log.append("w", ev("fresh"), [Open("rule:s", new=False)])  # opens a closed key too
    assert (await event_log.get_open("w", "rule:s"))["n"] == "fresh"  # type: ignore[index]


async def test_ops_of_one_append_apply_in_order(event_log: EventLog) -> None:
    await event_log.append("w", ev(1), [Open("turn:a")])
    await event_log.append("w", ev(2), [Close("turn:a"), Open("turn:a")])  # hand the key over
    assert (await event_log.get_open("w", "turn:a"))["seq"] == 2  # type: ignore[index]
    with pytest.raises(Conflict) as err:
        await event_log.append("w", ev(3), [Claim("k"), Claim("k")])
    assert err.value.reason == "claimed"
    with pytest.raises(Conflict) as err:
        await event_log.append("w", ev(4), [Open("x"), Close("x"), Close("x")])
    assert (err.value.key, err.value.reason) == ("x", "closed")
    assert await event_log.last_seq("w") == 2 and not await event_log.is_claimed("w", "k")


async def test_a_batch_gets_consecutive_seqs_and_each_event_its_own_ops(event_log: EventLog) -> None:
    await event_log.append("w", ev("before"))
    stored = await event_log.append_batch("w", [
        (ev("reply"), [Open("call:c1"), Claim("issued:c1"), Tag("mem")]),
        (ev("ask"), [Open("approval:a1"), Tag("trail"), Tag("mem")]),  # sees call:c1 already open
        (ev("answer"), [Close("call:c1"), Tag("trail")]),
    ])
    assert [(e["seq"], e["n"], e["world"]) for e in stored] == [(2, "reply", "w"), (3, "ask", "w"), (4, "answer", "w")]
    assert [e["n"] for e in await event_log.read("w")] == ["before", "reply", "ask", "answer"]
    assert [e["seq"] for e in await event_log.read_tagged("w", ["mem"])] == [2, 3]
    assert [e["seq"] for e in await event_log.read_tagged("w", ["trail"])] == [3, 4]
    assert await event_log.get_open("w", "call:c1") is None
    assert (await event_log.get_open("w", "approval:a1"))["seq"] == 3  # type: ignore[index]
    assert await event_log.append_batch("w", []) == [] and await event_log.last_seq("w") == 4


async def test_a_batch_with_one_failing_condition_writes_nothing(event_log: EventLog) -> None:
    await event_log.append("w", ev(1), [Claim("issued:c1")])
    with pytest.raises(Conflict) as err:
        await event_log.append_batch("w", [(ev("ok"), [Open("call:c2"), Tag("mem")]),
                                           (ev("late"), [Claim("issued:c1")])])
    assert (err.value.key, err.value.reason) == ("issued:c1", "claimed")
    with pytest.raises(Conflict):  # a later item's ops see the earlier items' effects
        await event_log.append_batch("w", [(ev("a"), [Open("k")]), (ev("b"), [Open("k")])])
    assert await event_log.last_seq("w") == 1
    assert await event_log.get_open("w", "call:c2") is None and await event_log.get_open("w", "k") is None
    assert await event_log.read_tagged("w", ["mem"]) == []
    assert await event_log.append_batch("nowhere", []) == [] and "nowhere" not in await event_log.worlds()


async def test_claim_is_permanent(event_log: EventLog) -> None:
    await event_log.append("w", ev(1), [Claim("exec:c1"), Open("call:c1")])
    assert await event_log.is_claimed("w", "exec:c1")
    assert not await event_log.is_claimed("w", "exec:c2")
    assert not await event_log.is_claimed("w2", "exec:c1")  # claims belong to one world
    await event_log.append("w", ev(2), [Close("call:c1")])
    await event_log.append("w", ev(3), [Open("call:c1")])
    await event_log.append("w", ev(4), [Close("call:c1")])
    with pytest.raises(Conflict) as err:
        await event_log.append("w", ev(5), [Claim("exec:c1")])
    assert (err.value.key, err.value.reason) == ("exec:c1", "claimed")
    assert await event_log.last_seq("w") == 4
    await event_log.append("w2", ev(1), [Claim("exec:c1")])


# -- tags ---------------------------------------------------------------------------------------
async def test_read_tagged_merges_tags_without_duplicates(event_log: EventLog) -> None:
    plan = [["a"], [], ["b"], ["a", "b"], ["c"], ["b", "a"], ["a"], [], ["b"]]
    for i, tags in enumerate(plan, start=1):
        await event_log.append("w", ev(i), [Tag(t) for t in tags])
    await event_log.append("w2", ev("elsewhere"), [Tag("a")])
    tagged = [i for i, tags in enumerate(plan, start=1) if {"a", "b"} & set(tags)]
    assert tagged == [1, 3, 4, 6, 7, 9]

    async def seqs(tags: list[str], **kw: Any) -> list[int]:
        return [e["seq"] for e in await event_log.read_tagged("w", tags, **kw)]

    assert await seqs(["a", "b"]) == tagged
    assert await seqs(["b", "a", "a"]) == tagged
    assert await seqs(["a"]) == [1, 4, 6, 7]
    assert await seqs(["a", "b"], after=4) == [6, 7, 9]
    assert await seqs(["a", "b"], limit=3) == [1, 3, 4]
    assert await seqs(["a", "b"], limit=3, newest=True) == [6, 7, 9]
    assert await seqs(["a", "b"], after=3, limit=10, newest=True) == [4, 6, 7, 9]
    assert await seqs(["a", "b"], newest=True) == tagged
    assert await seqs(["a", "b"], limit=2, newest=True, after=7) == [9]
    assert await seqs(["zzz"]) == [] and await seqs([]) == []
    events = await event_log.read_tagged("w", ["c"])
    assert [(e["seq"], e["n"], e["world"]) for e in events] == [(5, 5, "w")]



async def test_read_tagged_takes_any_limit_a_64_bit_integer_holds(event_log: EventLog) -> None:
    # As SQL's LIMIT does: a limit standing for "all of them" (sys.maxsize) is not refused.
    for i in (1, 2, 3):
        await event_log.append("w", ev(i), [Tag("t")])
    for limit in (10**17, 10**18, 2**63 - 1):
        assert [e["seq"] for e in await event_log.read_tagged("w", ["t"], limit=limit)] == [1, 2, 3]
        assert [e["seq"] for e in await event_log.read_tagged("w", ["t"], limit=limit, newest=True)] == [1, 2, 3]

# -- open items ----------------------------------------------------------------------------------
async def test_get_open_and_list_open_by_prefix_oldest_first(event_log: EventLog) -> None:
    keys = ["call:b", "call:a", "calls:x", "call", "cal:l", "call;", "approval:1", "call:", "call:é"]
    for key in keys:
        await event_log.append("w", ev(key), [Open(key)])
    await event_log.append("w2", ev("elsewhere"), [Open("call:zz")])

    async def listed(prefix: str) -> list[str]:
        return [e["n"] for e in await event_log.list_open("w", prefix)]

    # Oldest first by the opening event's seq (not by key); "call:" must not match "calls:x"
    # nor "call;" (the character right after ':'), and a key equal to the prefix matches.
    assert await listed("call:") == ["call:b", "call:a", "call:", "call:é"]
    assert await listed("call") == ["call:b", "call:a", "calls:x", "call", "call;", "call:", "call:é"]
    assert await listed("approval:") == ["approval:1"]
    assert await listed("") == keys
    assert await listed("nothing:") == []
    assert await event_log.list_open("nowhere", "call:") == []

    opened = await event_log.get_open("w", "call:a")
    assert opened is not None and (opened["seq"], opened["n"]) == (2, "call:a")
    assert await event_log.get_open("w", "call:zz") is None
    await event_log.append("w", ev("done"), [Close("call:b"), Close("call:")])
    assert await listed("call:") == ["call:a", "call:é"]
    assert await event_log.get_open("w", "call:b") is None


async def test_get_open_many_answers_only_the_open_keys_in_one_call(event_log: EventLog) -> None:
    await event_log.append("w", ev("both"), [Open("approval:1"), Open("call:1")])
    await event_log.append("w", ev("other"), [Open("call:2")])
    await event_log.append("w2", ev("elsewhere"), [Open("call:3")])
    await event_log.append("w", ev("answer"), [Close("call:2")])
    found = await event_log.get_open_many("w", ["approval:1", "call:1", "call:2", "call:3", "nothing"])
    assert {key: (e["seq"], e["n"]) for key, e in found.items()} == {"approval:1": (1, "both"), "call:1": (1, "both")}
    assert await event_log.get_open_many("w", []) == {}
    assert await event_log.get_open_many("nowhere", ["call:1"]) == {}


async def test_one_event_opening_several_keys_is_listed_once(event_log: EventLog) -> None:
    await event_log.append("w", ev(1), [Open("grant:c1:g1")])
    await event_log.append("w", ev(2), [Open("grant:c1:g2"), Open("grant:c2:g3")])
    assert [e["seq"] for e in await event_log.list_open("w", "grant:")] == [1, 2]
    assert [e["seq"] for e in await event_log.list_open("w", "grant:c2:")] == [2]



async def test_large_events_read_back_whole_between_small_ones_by_every_read(event_log: EventLog) -> None:
    """An event over 1 MiB is decoded in a worker after the read, not on the one reader thread every
    world's reads wait for (server/log/codec.py): each read still gives it whole, with its seq, in order."""
    text = "lorem ipsum match " * 60_000  # 1,080,000 characters
    await event_log.append("w", ev("small 1"), [Open("call:1"), Tag("t")])
    await event_log.append("w", ev("large", text=text), [Open("call:2"), Open("approval:2"), Tag("t")])
    await event_log.append("w", ev("small 3", text="match"), [Open("call:3"), Tag("t")])
    try:
        def shown(events: list[Event]) -> list[tuple[int, str, int]]:
            return [(e["seq"], e["n"], len(e.get("text", ""))) for e in events]
        want = [(1, "small 1", 0), (2, "large", len(text)), (3, "small 3", 5)]
        assert shown(await event_log.read("w")) == want
        assert shown(await event_log.read_tagged("w", ["t"])) == want
        assert shown(await event_log.list_open("w", "call:")) == want
        found = await event_log.get_open_many("w", ["call:2", "approval:2", "call:3"])
        assert found["call:2"] is found["approval:2"] and found["call:2"]["text"] == text
        assert shown([found["call:2"], found["call:3"]]) == want[1:]
        hits, _ = await event_log.search_between("w", "match", 0, 3)
        assert sorted(shown(hits)) == want[1:]
    finally:
        offload.shutdown()


async def test_reads_of_thousands_of_open_keys_and_tagged_events_miss_none(event_log: EventLog) -> None:
    # More keys than one Redis command's arguments are sliced into (server/log/redis/read.py).
    n = 2500
    for start in range(0, n, 500):
        await event_log.append_batch("w", [(ev(i), [Open(f"call:{i:05}"), Tag("t")])
                                           for i in range(start, start + 500)])
    assert [e["n"] for e in await event_log.list_open("w", "call:")] == list(range(n))
    found = await event_log.get_open_many("w", [f"call:{i:05}" for i in range(n)])
    assert [(key, e["n"], e["seq"]) for key, e in sorted(found.items())] == [
        (f"call:{i:05}", i, i + 1) for i in range(n)]
    assert [e["n"] for e in await event_log.read_tagged("w", ["t"])] == list(range(n))
    assert [e["n"] for e in await event_log.read_tagged("w", ["t"], limit=3, newest=True)] == [2497, 2498, 2499]

async def test_a_burst_of_reads_by_open_key_or_tag_needs_no_connection_each(event_log: EventLog) -> None:
    # A burst of handshakes reads open keys and tags at once: on a cluster too, each read must not
    # take a connection of its own (a node's pool holds 100, and refuses the 101st).
    await event_log.append("w", ev(1), [Open("call:1"), Tag("t")])
    reads: list[Any] = await asyncio.gather(*(read for _ in range(150) for read in (
        event_log.list_open("w", "call:"), event_log.get_open_many("w", ["call:1"]),
        event_log.read_tagged("w", ["t"]))))
    assert [[e["n"] for e in (r.values() if isinstance(r, dict) else r)] for r in reads] == [[1]] * 450

# -- races -------------------------------------------------------------------------------------------
async def _close_race(logs: list[EventLog], attempts: int = 100) -> None:
    await logs[0].append("w", ev("asked"), [Open("approval:x")])

    async def decide(i: int) -> int | None:
        try:
            seq: int = (await logs[i % len(logs)].append("w", ev(i), [Close("approval:x")]))["seq"]
            return seq
        except Conflict as exc:
            assert (exc.key, exc.reason) == ("approval:x", "closed")
            return None

    results = await asyncio.gather(*(decide(i) for i in range(attempts)))
    assert [r for r in results if r is not None] == [2]  # the first decision wins, once
    for log in logs:
        assert await log.last_seq("w") == 2
        assert await seqs_of(log, "w") == [1, 2]
        assert await log.get_open("w", "approval:x") is None


async def test_first_close_wins(event_log: EventLog) -> None:
    await _close_race([event_log])


async def test_first_close_wins_across_instances(log_impl: LogImpl) -> None:
    await _close_race([await log_impl.open(), await log_impl.open()])  # two connections/processes


async def test_concurrent_appends_get_gap_free_seqs(log_impl: LogImpl) -> None:
    logs = [await log_impl.open(), await log_impl.open()]
    tasks, per_task = 6, 30

    async def writer(t: int) -> list[int]:
        return [(await logs[t % 2].append("w", ev(f"{t}-{i}"), [Tag(f"t{t}")]))["seq"]
                for i in range(per_task)]

    results = await asyncio.gather(*(writer(t) for t in range(tasks)))
    total = tasks * per_task
    assert sorted(s for r in results for s in r) == list(range(1, total + 1))
    events = await logs[1].read("w", limit=total + 10)
    assert [e["seq"] for e in events] == list(range(1, total + 1))
    for t, got in enumerate(results):
        assert got == sorted(got)  # each writer's events keep its order
        mine = [e for e in events if e["n"].startswith(f"{t}-")]
        assert [e["seq"] for e in mine] == got
        assert [e["n"] for e in mine] == [f"{t}-{i}" for i in range(per_task)]
        assert [e["seq"] for e in await logs[0].read_tagged("w", [f"t{t}"])] == got



async def test_concurrent_appends_to_several_worlds_keep_each_world_apart(event_log: EventLog) -> None:
    # Gathered, these go in one flush (on Redis: one script call for every world): each world's
    # seqs, open keys, claims and tags stay its own, and one world's conflict fails only its append.
    await event_log.append("b", ev("setup"), [Open("k"), Claim("c")])

    async def write(world: str, i: int, ops: list[Any]) -> int | str:
        try:
            seq: int = (await event_log.append(world, ev(f"{world}{i}"), ops))["seq"]
            return seq
        except Conflict as exc:
            return exc.reason

    results = await asyncio.gather(
        *(write(w, i, [Open(f"k{i}"), Tag("t")]) for i in range(4) for w in ("a", "b", "c")),
        write("b", 9, [Open("k")]), write("a", 9, [Open("k"), Claim("c")]), write("b", 10, [Claim("c")]))
    assert results[-3:] == ["open", 5, "claimed"]
    for world, first in (("a", 1), ("b", 2), ("c", 1)):
        assert await seqs_of(event_log, world) == list(range(1, first + 4 + (world == "a")))
        assert [e["n"] for e in await event_log.read_tagged(world, ["t"])] == [f"{world}{i}" for i in range(4)]
        opened = {e["n"] for e in await event_log.list_open(world, "k")}
        assert opened == {f"{world}{i}" for i in range(4)} | ({"setup"} if world == "b" else {"a9"} if world == "a"
                                                              else set())
    assert await event_log.is_claimed("a", "c") and not await event_log.is_claimed("c", "c")

# -- durability and worlds --------------------------------------------------------------------------
async def test_everything_survives_reopening(log_impl: LogImpl) -> None:
    log = await log_impl.open()
    await log.append("w", ev(1), [Open("call:1"), Claim("issued:1"), Tag("memory")])
    await log.append("w", ev(2), [Open("call:2"), Tag("memory")])
    await log.append("w", ev(3), [Close("call:1")])
    await log.append("v", ev(1))

    log = await log_impl.reopen(log)
    assert [e["n"] for e in await log.read("w")] == [1, 2, 3]
    assert await log.last_seq("w") == 3
    assert [e["seq"] for e in await log.list_open("w", "call:")] == [2]
    assert await log.is_claimed("w", "issued:1")
    assert [e["seq"] for e in await log.read_tagged("w", ["memory"])] == [1, 2]
    assert await log.worlds() == ["v", "w"]
    assert (await log.append("w", ev(4)))["seq"] == 4
    with pytest.raises(Conflict):
        await log.append("w", ev(5), [Open("call:2")])


async def test_worlds_lists_every_world_with_events(event_log: EventLog) -> None:
    assert await event_log.worlds() == []
    await event_log.append("w2", ev(1))
    await event_log.append("w1", ev(1))
    await event_log.append("w2", ev(2))
    with pytest.raises(Conflict):
        await event_log.append("w3", ev(1), [Close("nothing")])  # a failed append makes no world
    assert await event_log.worlds() == ["w1", "w2"]
    assert await event_log.last_seq("w3") == 0


async def test_world_names_cannot_reach_other_worlds(event_log: EventLog) -> None:
    odd = ["a", "a}:tag:x", "{a}", "a:b", "a%7D", "é w"]
    for world in odd:
        await event_log.append(world, ev(world), [Open("k"), Claim("c"), Tag("x}:seq")])
    for world in odd:
        assert [e["n"] for e in await event_log.read(world)] == [world]
        assert await event_log.last_seq(world) == 1
        assert [e["n"] for e in await event_log.read_tagged(world, ["x}:seq"])] == [world]
        assert [e["n"] for e in await event_log.list_open(world, "")] == [world]
    assert await event_log.worlds() == sorted(odd)


async def test_worlds_come_in_pages_by_id(event_log: EventLog) -> None:
    for world in ["c", "a", "e", "b", "d"]:
        await event_log.append(world, ev(world))
    assert await event_log.worlds(limit=2) == ["a", "b"]
    assert await event_log.worlds("b", limit=2) == ["c", "d"]
    assert await event_log.worlds("d", limit=2) == ["e"]
    assert await event_log.worlds("e", limit=2) == []
    assert await event_log.worlds("bb") == ["c", "d", "e"]


# -- the work index ---------------------------------------------------------------------------------
async def test_a_world_is_in_the_work_index_while_it_has_open_work(event_log: EventLog) -> None:
    await event_log.append("idle", ev(1), [Open("world"), Open("agent:a"), Open("rule:r"), Claim("issued:x")])
    await event_log.append("asked", ev(1), [Open("approval:x")])
    await event_log.append("owed", ev(1), [Open("turn:a:c", new=False)])
    assert await event_log.worlds_with_work() == ["asked", "owed"]
    assert not await event_log.unlist_if_idle("asked")  # its request is pending: it stays
    await event_log.append("asked", ev(2), [Close("approval:x"), Open("call:x")])
    assert not await event_log.unlist_if_idle("asked")
    await event_log.append("asked", ev(3), [Close("call:x")])
    assert await event_log.unlist_if_idle("asked") and await event_log.unlist_if_idle("idle")
    assert await event_log.worlds_with_work() == ["owed"]
    await event_log.append("asked", ev(4), [Open("turn:a:c", new=False)])  # work again: back in at once
    assert await event_log.worlds_with_work() == ["asked", "owed"]


async def test_the_work_index_survives_reopening(log_impl: LogImpl) -> None:
    log = await log_impl.open()
    await log.append("w", ev(1), [Open("approval:x")])
    await log.append("v", ev(1), [Open("turn:a:c")])
    await log.append("v", ev(2), [Close("turn:a:c")])
    assert await log.unlist_if_idle("v")
    log = await log_impl.reopen(log)
    assert await log.worlds_with_work() == ["w"]


async def test_a_release_racing_appends_that_open_work_never_loses_the_work(log_impl: LogImpl) -> None:
    # One process releases idle worlds while another opens work in them: whatever the interleaving,
    # every world with open work at the end is in the index.
    releaser, writer = await log_impl.open(), await log_impl.open()
    worlds = [f"w{i}" for i in range(30)]
    for world in worlds:
        await writer.append(world, ev(0), [Open("turn:a:c")])
        await writer.append(world, ev(1), [Close("turn:a:c")])

    async def release(world: str) -> None:
        for _ in range(3):
            await releaser.unlist_if_idle(world)

    async def work(world: str) -> None:
        await asyncio.sleep(0)
        await writer.append(world, ev(2), [Open("approval:x")])

    await asyncio.gather(*(release(w) for w in worlds), *(work(w) for w in worlds[::2]))
    with_work = set(await releaser.worlds_with_work())
    assert with_work >= set(worlds[::2])
    for world in worlds[::2]:
        assert not await releaser.unlist_if_idle(world)


# -- connecting -------------------------------------------------------------------------------------
async def test_redis_log_unreachable_names_the_url_without_password() -> None:
    with pytest.raises(ConnectionError) as err:
        await RedisLog.open("redis://someone:s3cret@127.0.0.1:1/0", "awtest")
    assert "127.0.0.1:1" in str(err.value) and "s3cret" not in str(err.value)


async def test_open_backends_embedded(tmp_path: Path) -> None:
    data = tmp_path / "new" / "data"
    log, bus = await open_backends(data_dir=data, redis_url=None)
    try:
        assert isinstance(log, SqliteLog) and isinstance(bus, Bus)
        assert (data / "agent-world.sqlite3").exists()
        async with bus.subscribe("c") as sub:
            await bus.publish("c", "hi")
            assert await asyncio.wait_for(sub.get(), 2) == "hi"
    finally:
        await bus.disconnect()
        await log.close()


async def test_open_backends_rejects_bad_places(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(DataDirError, match="data folder"):
        await open_backends(data_dir=tmp_path / "file" / "data", redis_url=None)
    with pytest.raises(DataDirError, match="not a folder"):
        await open_backends(data_dir=tmp_path / "file", redis_url=None)
    with pytest.raises(ValueError, match="unsupported"):
        await open_backends(data_dir=tmp_path, redis_url="http://127.0.0.1:6379")
    with pytest.raises(ConnectionError, match=re.escape("127.0.0.1:1")):
        await open_backends(data_dir=tmp_path, redis_url="redis://127.0.0.1:1/0")


async def test_open_backends_redis(redis_url: str, tmp_path: Path) -> None:
    log, bus = await open_backends(data_dir=tmp_path, redis_url=redis_url)
    try:
        assert isinstance(log, RedisLog) and isinstance(bus, Bus)
        assert isinstance(await log.worlds(), list)
    finally:
        await bus.disconnect()
        await log.close()



async def test_reads_and_leases_go_on_after_redis_forgot_its_scripts(private_redis: RedisServer) -> None:
    # A restarted Redis has no scripts: a read or lease sent by its hash gets NOSCRIPT, and must load it.
    log = await RedisLog.open(private_redis.url, prefix="forgot")
    try:
        await log.append("w", ev(1), [Open("call:1"), Tag("t")])
        private_redis.client().script_flush()
        assert [e["n"] for e in await log.list_open("w", "call:")] == [1]
        private_redis.client().script_flush()
        assert (await log.get_open_many("w", ["call:1"]))["call:1"]["n"] == 1
        private_redis.client().script_flush()
        assert [e["n"] for e in await log.read_tagged("w", ["t"])] == [1]
        private_redis.client().script_flush()
        assert await log.lease("agent:w/a", "proc", ttl=5) > 0
        private_redis.client().script_flush()
        await log.release("agent:w/a", "proc")
        assert await log.lease_holder("agent:w/a") is None
    finally:
        await log.close()

# -- storage failures -------------------------------------------------------------------------------
# A storage that fails raises one class from either log, chained to the storage's own error: callers catch
# `StorageError` (a 503, a retry), never the storage's exceptions, and need no storage's module to do so.
@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (mounting needs root, as CI runs: without it this fails, never skips)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.fail(f"this test mounts a small tmpfs and needs root: {mounted.stderr.strip()}", pytrace=False)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


async def test_a_write_the_sqlite_disk_cannot_take_raises_storage_error_from_sqlites_own(tiny_disk: Path) -> None:
    log = await SqliteLog.open(tiny_disk / "log.sqlite3")
    try:
        await log.append("w", ev(1), [Open("call:1")])
        with pytest.raises(StorageError, match="full") as err:
            await log.append("w", ev(2, blob="x" * 2 * 2**20), [Close("call:1"), Claim("c")])
        assert isinstance(err.value.__cause__, sqlite3.OperationalError)
        assert not log.may_have_stored(err.value)
        assert [e["n"] for e in await log.read("w")] == [1]  # nothing of it was written; reads go on
        assert await log.get_open("w", "call:1") is not None and not await log.is_claimed("w", "c")
    finally:
        await log.close()


async def test_every_operation_on_a_stopped_redis_raises_storage_error_from_redis_own(
        private_redis: RedisServer) -> None:
    log = await RedisLog.open(private_redis.url, prefix="stopped")
    bus = Bus(RedisBackend(private_redis.url))
    await bus.connect()
    try:
        await log.append("w", ev(1), [Open("call:1"), Tag("t")])
        private_redis.stop()  # a crash: the port now refuses connections
        operations: dict[str, Callable[[], Awaitable[object]]] = {
            "append": lambda: log.append("w", ev(2)), "read": lambda: log.read("w"),
            "read_tagged": lambda: log.read_tagged("w", ["t"]), "get_open": lambda: log.get_open("w", "call:1"),
            "list_open": lambda: log.list_open("w", "call:"), "is_claimed": lambda: log.is_claimed("w", "c"),
            "last_seq": lambda: log.last_seq("w"), "worlds": log.worlds,
            "lease": lambda: log.lease("l", "me", ttl=5), "release": lambda: log.release("l", "me"),
            "lease_holder": lambda: log.lease_holder("l"), "publish": lambda: bus.publish("c", "hi")}
        for name, operation in operations.items():
            with pytest.raises(StorageError) as err:
                await operation()
            assert isinstance(err.value.__cause__, redis.RedisError | OSError), (name, repr(err.value.__cause__))
            assert not isinstance(err.value, Conflict)
            # The append's answer is lost with its connection: it may have been stored, as the engine must assume.
            assert log.may_have_stored(err.value) == (name == "append"), name
    finally:
        await bus.disconnect()
        await log.close()


# -- leases -------------------------------------------------------------------------------------
async def test_a_lease_has_one_holder_until_it_expires(log_impl: LogImpl) -> None:
    a, b = await log_impl.open(), await log_impl.open()
    assert await a.lease("agent:w/alice", "proc-a", ttl=0.3)
    assert not await b.lease("agent:w/alice", "proc-b", ttl=0.3)
    assert await a.lease("agent:w/alice", "proc-a", ttl=0.3)  # renewing
    assert await b.lease_holder("agent:w/alice") == "proc-a"
    await asyncio.sleep(0.45)
    assert await b.lease_holder("agent:w/alice") is None
    assert await b.lease("agent:w/alice", "proc-b", ttl=5)
    assert not await a.lease("agent:w/alice", "proc-a", ttl=5)


async def test_a_lease_is_released_only_by_its_holder(log_impl: LogImpl) -> None:
    log = await log_impl.open()
    assert await log.lease("x", "one", ttl=5)
    await log.release("x", "two")
    assert await log.lease_holder("x") == "one"
    await log.release("x", "one")
    assert await log.lease_holder("x") is None
    assert await log.lease("x", "two", ttl=5)


async def test_concurrent_lease_takers_get_one_winner(log_impl: LogImpl) -> None:
    logs = [await log_impl.open() for _ in range(3)]
    results = await asyncio.gather(*(logs[i % 3].lease("race", f"holder-{i}", ttl=5) for i in range(30)))
    assert sum(bool(r) for r in results) == 1


async def test_a_fencing_token_grows_each_time_the_lease_changes_hands(log_impl: LogImpl) -> None:
    a, b = await log_impl.open(), await log_impl.open()
    first = await a.lease("agent:w/alice", "proc-a", ttl=0.3, world="w")
    assert first >= 1
    assert await a.lease("agent:w/alice", "proc-a", ttl=0.3, world="w") == first  # renewed: same token
    assert await b.lease("agent:w/alice", "proc-b", ttl=5, world="w") == 0
    await asyncio.sleep(0.45)
    taken = await b.lease("agent:w/alice", "proc-b", ttl=5, world="w")
    assert taken > first
    await b.release("agent:w/alice", "proc-b", world="w")
    again = await b.lease("agent:w/alice", "proc-b", ttl=5, world="w")  # released and taken again: new token
    assert again > taken
    # A lease of another world, or of no world, with the same name is another lease.
    assert await a.lease("agent:w/alice", "proc-a", ttl=5, world="v") >= 1
    assert await a.lease("agent:w/alice", "proc-a", ttl=5) >= 1
    assert await a.lease_holder("agent:w/alice", world="w") == "proc-b"
    assert await a.lease_holder("agent:w/alice", world="v") == "proc-a"


async def test_a_mark_keeps_no_token_once_released_or_expired(log_impl: LogImpl,
                                                              request: pytest.FixtureRequest) -> None:
    """A mark (one per tool call: its `began`) is a lease nothing is fenced by: its token lives and dies
    with it. Before, every one left its fencing counter behind for good (72 bytes a tool call in Redis)."""
    a, b = await log_impl.open(), await log_impl.open()
    for _ in range(3):  # a fenced lease's token would grow each time
        assert await a.lease("began:w:call_1", "proc-a", ttl=5, mark=True) == 1
        assert await a.lease("began:w:call_1", "proc-a", ttl=5, mark=True) == 1  # renewed
        assert await b.lease("began:w:call_1", "proc-b", ttl=5, mark=True) == 0
        await a.release("began:w:call_1", "proc-a", mark=True)
        assert await a.lease_holder("began:w:call_1") is None
    assert await a.lease("began:w:call_2", "proc-a", ttl=0.2, mark=True) == 1
    await asyncio.sleep(0.35)
    assert await b.lease("began:w:call_2", "proc-b", ttl=5, mark=True) == 1  # expired: its token too
    await b.release("began:w:call_2", "proc-b", mark=True)
    if log_impl.name == "redis":  # nothing of either is left in the store
        prefix = a.prefix  # type: ignore[attr-defined]
        with redis.Redis.from_url(request.getfixturevalue("redis_url")) as client:
            assert [k for k in client.scan_iter(match=f"{{{prefix}}}:*") if b"began" in k] == []


async def test_an_append_with_a_stale_fencing_token_is_refused_and_writes_nothing(log_impl: LogImpl) -> None:
    a, b = await log_impl.open(), await log_impl.open()
    token_a = await a.lease("agent:w/alice", "proc-a", ttl=0.3, world="w")
    await a.append("w", ev(1), [Fence("agent:w/alice", token_a), Open("turn")])
    await asyncio.sleep(0.45)  # proc-a paused past its lease; proc-b takes it over
    token_b = await b.lease("agent:w/alice", "proc-b", ttl=5, world="w")
    with pytest.raises(Conflict) as err:
        await a.append_batch("w", [(ev(2), [Tag("memory"), Claim("issued:x")]),
                                   (ev(3), [Fence("agent:w/alice", token_a), Close("turn")])])
    assert (err.value.key, err.value.reason) == ("agent:w/alice", "fenced")
    assert await a.last_seq("w") == 1 and not await a.is_claimed("w", "issued:x")
    assert await a.get_open("w", "turn") is not None
    # The holder's writes go through; a lease no one ever took fences everything.
    assert (await b.append("w", ev(4), [Fence("agent:w/alice", token_b), Close("turn")]))["seq"] == 2
    with pytest.raises(Conflict):
        await b.append("w", ev(5), [Fence("agent:w/nobody", 1)])
    assert await b.last_seq("w") == 2


# -- search (issue #31 item 8) ------------------------------------------------------------------
def _message(chat: str, content: Any = None, **extra: Any) -> dict[str, Any]:
    return {"kind": "message", "chat": chat, "role": "user", "content": content, **extra}


async def test_search_finds_messages_and_tool_calls_newest_first(event_log: EventLog) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "shell_exec",
                                                              "arguments": '{"command": "grep Needle src"}'}}
    await event_log.append("w", _message("main", "the NEEDLE is here"))  # 1
    await event_log.append("w", _message("main", None, role="assistant", tool_calls=[call]))  # 2
    await event_log.append("w", _message("main", "found: needle at line 3", role="tool"))  # 3
    await event_log.append("w", {"kind": "chat_created", "chat": {"id": "needle", "title": "needle"}})  # 4: no message
    await event_log.append("w", _message("other", [{"type": "text", "text": "a needle elsewhere"}]))  # 5
    await event_log.append("w", _message("main", "nothing to see", meta="needle"))  # 6: only its metadata holds it
    await event_log.append("w2", _message("main", "needle in another world"))
    assert [e["seq"] for e in await event_log.search("w", "needle")] == [5, 3, 2, 1]
    assert [e["seq"] for e in await event_log.search("w", "needle", chat="main")] == [3, 2, 1]
    assert [e["seq"] for e in await event_log.search("w", "needle", limit=2)] == [5, 3]
    assert (await event_log.search("w", "NEEDLE is"))[0]["content"] == "the NEEDLE is here"  # with its seq and body
    assert await event_log.search("w", "haystack") == []
    assert await event_log.search("nowhere", "needle") == []


async def test_search_takes_its_query_literally(event_log: EventLog) -> None:
    for content in ("100% sure", "a_b", 'say "hi"', "back\\slash", "héllo ☃", "1000 sure", "axb"):
        await event_log.append("w", _message("main", content))
    for query, seqs in (("100%", [1]), ("a_b", [2]), ('"hi"', [3]), ("k\\s", [4]), ("héllo ☃", [5]),
                        ("% sure", [1]), ("_", [2])):
        assert [e["seq"] for e in await event_log.search("w", query)] == seqs, query


async def test_search_looks_through_a_bounded_window_in_chunks(event_log: EventLog) -> None:
    event_log.search_chunk = 3  # many steps over a few events
    for i in range(1, 21):
        await event_log.append("w", _message("main", f"line {i} {'match' if i % 4 == 0 else ''}"))
    assert [e["seq"] for e in await event_log.search("w", "match")] == [20, 16, 12, 8, 4]
    assert [e["seq"] for e in await event_log.search("w", "match", window=10)] == [20, 16, 12]  # the newest 10 only
    assert [e["seq"] for e in await event_log.search("w", "match", limit=3)] == [20, 16, 12]


async def test_search_steps_stop_at_their_bytes_and_go_on_from_there(event_log: EventLog) -> None:
    for i in range(1, 11):
        await event_log.append("w", _message("main", f"line {i} {'match' if i % 3 == 0 else ''} " + "x" * 500))
    event_log.search_step_bytes = 1200  # two events of about 600 bytes each per step
    hits, reached = await event_log.search_between("w", "match", 0, 10)
    assert (reached, [e["seq"] for e in hits]) == (8, [9])  # looked at 10 and 9, newest first
    event_log.search_step_bytes = 1  # at least one event per step, however small the budget
    assert (await event_log.search_between("w", "match", 0, 6))[1] == 5
    assert [e["seq"] for e in await event_log.search("w", "match")] == [9, 6, 3]  # every step, to the end
    assert [e["seq"] for e in await event_log.search("w", "match", limit=2)] == [9, 6]


async def test_search_tests_the_shown_form_and_counts_only_what_is_shown(event_log: EventLog) -> None:
    await event_log.append("w", _message("main", "public kiwi"))  # 1
    await event_log.append("w", _message("main", "hidden kiwi"))  # 2: its shown form hides the word

    async def shown(event: Event) -> Event:
        return {**event, "content": str(event["content"]).replace("hidden kiwi", "[redacted]")}
    found = await event_log.search("w", "kiwi", limit=1, shown=shown)
    assert [(e["seq"], e["content"]) for e in found] == [(1, "public kiwi")]
