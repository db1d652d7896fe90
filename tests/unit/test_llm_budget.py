"""A world's budget of LLM calls a minute (server/engine/turns/budget.py), on a clock the test moves."""
from __future__ import annotations

from server.engine.turns.budget import LLMBudget, Wait


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_world_makes_a_minutes_calls_at_once_then_waits_its_turn() -> None:
    clock = Clock()
    budget = LLMBudget(clock)
    assert [budget.reserve("w", 6).seconds for _ in range(6)] == [0.0] * 6
    waits = [budget.reserve("w", 6) for _ in range(3)]
    assert [w.seconds for w in waits] == [10.0, 20.0, 30.0]  # one call each 10 s, in turn
    assert [w.tell for w in waits] == [True, False, False]  # the chat is told once for the run


def test_the_budget_refills_with_time_and_a_new_run_is_told_again() -> None:
    clock = Clock()
    budget = LLMBudget(clock)
    for _ in range(2):
        budget.reserve("w", 2)
    assert [budget.reserve("w", 2) for _ in range(2)] == [Wait(30.0, tell=True), Wait(60.0, tell=False)]
    clock.now += 120  # the waits ran out, and the bucket is full again
    assert [budget.reserve("w", 2).seconds for _ in range(2)] == [0.0, 0.0]
    again = budget.reserve("w", 2)
    assert again.seconds == 30.0 and again.tell


def test_each_world_has_a_budget_of_its_own() -> None:
    budget = LLMBudget(Clock())
    budget.reserve("busy", 1)
    assert budget.reserve("busy", 1).seconds == 60.0
    assert budget.reserve("quiet", 1).seconds == 0.0


def test_a_lowered_budget_applies_at_once() -> None:
    budget = LLMBudget(Clock())
    budget.reserve("w", 100)
    # The 99 calls left of the old budget are capped at the new one: one now, the next a minute later.
    assert [budget.reserve("w", 1).seconds for _ in range(2)] == [0.0, 60.0]
