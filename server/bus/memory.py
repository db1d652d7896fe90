"""The embedded bus backend: one process, so the `Bus` delivers each message as it is published."""
from __future__ import annotations

import asyncio

from .base import Backend


class MemoryBackend(Backend):
    in_process = True

    async def subscribe(self, channel: str) -> None:
        pass

    async def unsubscribe(self, channel: str) -> None:
        pass

    async def publish(self, channel: str, message: str) -> None:
        pass  # the Bus delivers it (a subclass may fail here, as a broken connection would)

    async def next_published(self) -> tuple[str, str]:
        never: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
        return await never  # nothing comes from another process
