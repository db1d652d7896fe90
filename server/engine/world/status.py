"""Live agent status (thinking, waiting for approval, …): not persisted, published as `status` frames."""
from __future__ import annotations

from typing import Any

from ... import vocab
from ...redact import redact
from ..store import Store


class StatusBoard:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._states: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, world: str, agent: str) -> dict[str, Any]:
        return self._states.get((world, agent), {"type": "status", "agent": agent, "state": vocab.IDLE})

    async def set(self, world: str, agent: str, state: str, **extra: Any) -> None:
        # Details such as `last_error` quote what an LLM endpoint said: hidden like every event's.
        frame = {"type": "status", "agent": agent, "state": state, **redact(extra)}
        if self._states.get((world, agent)) == frame:
            return
        self._states[(world, agent)] = frame
        await self.store.publish(world, frame)

    def observe(self, world: str, frame: dict[str, Any]) -> None:
        """Keep up with status published by another process."""
        if isinstance(frame.get("agent"), str):
            self._states[(world, frame["agent"])] = frame

    def forget(self, world: str) -> None:
        for key in [k for k in self._states if k[0] == world]:
            del self._states[key]
