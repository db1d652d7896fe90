"""A world's rules and grants as they stood at each point of its audit trail (for `RuleBook`'s
decisions that a restart cut short)."""
from __future__ import annotations

from ... import vocab
from ...vocab import Event

RULE_EVENTS = frozenset({vocab.RULE_ADDED, vocab.RULE_REVOKED, vocab.GRANT_ADDED, vocab.GRANT_REVOKED,
                         vocab.GRANT_EXPIRED})


class RuleReplay:
    """Feed it the trail's rule and grant events in order (`step`); it holds the rules and grants then,
    and counts, for each tool, the changes to its rules and grants so far (`changes`): a pending request's
    verdict depends on nothing else, so it need only be judged again when that count moved."""

    def __init__(self) -> None:
        self._rules: dict[str, Event] = {}
        self._grants: dict[str, Event] = {}
        self._tool_of: dict[str, str] = {}  # rule or grant id -> its tool (a revocation names only the id)
        self._changes: dict[str, int] = {}

    @property
    def rules(self) -> list[Event]:
        return list(self._rules.values())

    @property
    def grants(self) -> list[Event]:
        return list(self._grants.values())

    def changes(self, tool: str) -> int:
        return self._changes.get(tool, 0)

    def step(self, event: Event) -> bool:
        """Apply one event; whether it is an addition that decides pending requests at once (a rule or
        grant that allows or denies: an "ask" rule applies only to calls made after it)."""
        kind = event["kind"]
        if kind in (vocab.RULE_ADDED, vocab.GRANT_ADDED):
            item = event["rule"] if kind == vocab.RULE_ADDED else event["grant"]
            (self._rules if kind == vocab.RULE_ADDED else self._grants)[item["id"]] = event
            tool = self._tool_of[item["id"]] = str(item.get("tool"))
            self._changes[tool] = self.changes(tool) + 1
            return bool(item.get("effect") != "ask")
        if kind in (vocab.RULE_REVOKED, vocab.GRANT_REVOKED, vocab.GRANT_EXPIRED):
            item_id = str(event.get("rule_id") if kind == vocab.RULE_REVOKED else event.get("grant_id"))
            (self._rules if kind == vocab.RULE_REVOKED else self._grants).pop(item_id, None)
            if item_id in self._tool_of:
                self._changes[self._tool_of[item_id]] = self.changes(self._tool_of[item_id]) + 1
        return False
