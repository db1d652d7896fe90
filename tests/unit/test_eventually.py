"""The tests' polling helper fails with what it waited for and the last value it saw."""
from __future__ import annotations

import pytest

from tests.fixtures.eventually import eventually, eventually_async


def test_eventually_returns_the_first_accepted_value_and_reports_the_last_one_seen() -> None:
    values = iter(range(100))
    assert eventually(lambda: next(values), accept=lambda n: n >= 3, interval=0) == 3
    with pytest.raises(AssertionError, match=r"waiting for the answer; last value seen: \['no'\]"):
        eventually(lambda: ["no"], accept=lambda v: v == ["yes"], timeout=0, what="the answer")


async def test_eventually_async_takes_plain_and_async_probes() -> None:
    async def ready() -> str:
        return "ready"
    assert await eventually_async(ready) == "ready"
    assert await eventually_async(lambda: 7) == 7
    with pytest.raises(AssertionError, match="last value seen: 0"):
        await eventually_async(lambda: 0, timeout=0)
