"""The embedded bus backend: one process, no serialization beyond the JSON text itself."""
from __future__ import annotations

import asyncio

from .base import Backend


class MemoryBackend(Backend):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._channels: set[str] = set()

    async def subscribe(self, channel: str) -> None:
        self._channels.add(channel)

    async def unsubscribe(self, channel: str) -> None:
        self._channels.discard(channel)

    async def publish(self, channel: str, message: str) -> None:
        if channel in self._channels:
            self._queue.put_nowait((channel, message))

    async def next_published(self) -> tuple[str, str]:
        return await self._queue.get()
