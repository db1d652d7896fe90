"""Who is connected to a world right now, published as `presence` frames (PROTOCOL §6).

`LocalPresence` knows the connections of this process only: in the distributed mode each process
publishes what it sees, so a client shows the members connected through the same process.
"""
from __future__ import annotations

import itertools
from typing import Any

from ..engine.store import Store


class LocalPresence:
    """Connections per world, in this process; every join and leave publishes the new member list."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._worlds: dict[str, dict[str, dict[str, Any]]] = {}  # world -> connection id -> member
        self._ids = itertools.count(1)

    async def join(self, world: str, member: dict[str, Any]) -> str:
        """Record a connection of `member` ({"name", "role"}); returns its connection id."""
        connection_id = f"conn_{next(self._ids)}"
        self._worlds.setdefault(world, {})[connection_id] = {"name": str(member["name"]),
                                                              "role": str(member["role"])}
        await self._publish(world)
        return connection_id

    async def leave(self, world: str, connection_id: str) -> None:
        """Forget a connection (unknown ids are ignored, so a double leave is harmless)."""
        connections = self._worlds.get(world)
        if connections is None or connections.pop(connection_id, None) is None:
            return
        if not connections:
            del self._worlds[world]
        await self._publish(world)

    def members(self, world: str) -> list[dict[str, Any]]:
        """[{"name", "role", "connections"}], one entry per (name, role), sorted by name."""
        counts: dict[tuple[str, str], int] = {}
        for member in self._worlds.get(world, {}).values():
            key = (member["name"], member["role"])
            counts[key] = counts.get(key, 0) + 1
        return [{"name": name, "role": role, "connections": n} for (name, role), n in sorted(counts.items())]

    async def _publish(self, world: str) -> None:
        await self.store.publish(world, {"type": "presence", "members": self.members(world)})
