"""Which events of a world a listener has handled, whether they came by the bus or from the log.

The bus may deliver events out of seq order (two processes append, each publishes its own) and may
lose some (a reconnect: see `bus.Gap`). After a gap the listener reads the log from `floor`, the
highest seq below which it has handled everything; what it handled above that is skipped, as is an
event the bus then delivers that the log already gave it.
"""
from __future__ import annotations

MAX_AHEAD = 10_000  # handled seqs kept above a hole: past this, the hole is filled from the log


class Handled:
    def __init__(self, floor: int = 0) -> None:
        self.floor = floor  # every seq <= floor was handled
        self._above: set[int] = set()  # handled seqs > floor (there is a hole at floor + 1)

    def add(self, seq: int) -> bool:
        """Mark `seq` handled; False if it already was."""
        if seq <= self.floor or seq in self._above:
            return False
        self._above.add(seq)
        while self.floor + 1 in self._above:
            self.floor += 1
            self._above.discard(self.floor)
        return True

    def __contains__(self, seq: int) -> bool:
        return seq <= self.floor or seq in self._above

    def lost_after(self, end: int) -> bool:
        """The log ends at `end`: forget what was handled after it (the storage lost those events, and
        new ones take their seqs). True if there was any."""
        if self.floor <= end and all(seq <= end for seq in self._above):
            return False
        self.floor = min(self.floor, end)
        self._above = {seq for seq in self._above if seq <= end}
        return True

    @property
    def holey(self) -> bool:
        """Too much handled above a hole: time to fill it from the log."""
        return len(self._above) > MAX_AHEAD
