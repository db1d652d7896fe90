"""Streaming LLM text to every screen: the first delta at once, then at most one frame per interval.

A model can emit 50-100 tiny deltas a second; sending each as its own frame to every
connection costs one send per delta per viewer. Joining the deltas of one short interval
keeps the stream live to the eye while dividing the frames (bench/fanout.py measures it).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

CHUNK_INTERVAL = 0.04  # seconds: about 25 frames a second at most, per streaming message


class ChunkStream:
    def __init__(self, publish: Callable[[str], Awaitable[None]], interval: float = CHUNK_INTERVAL) -> None:
        self._publish = publish
        self._interval = interval
        self._pending: list[str] = []
        self._last_sent = float("-inf")
        self._timer: asyncio.Task[None] | None = None

    async def add(self, delta: str) -> None:
        self._pending.append(delta)
        if self._timer is not None:
            return  # a flush is already scheduled
        wait = self._last_sent + self._interval - asyncio.get_running_loop().time()
        if wait <= 0:
            await self.flush()
        else:
            self._timer = asyncio.create_task(self._flush_later(wait))

    async def _flush_later(self, wait: float) -> None:
        await asyncio.sleep(wait)
        self._timer = None
        await self.flush()

    async def flush(self) -> None:
        if not self._pending:
            return
        text, self._pending = "".join(self._pending), []
        self._last_sent = asyncio.get_running_loop().time()
        await self._publish(text)

    async def close(self) -> None:
        """Send what is left (before the whole message is stored)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush()

    def discard(self) -> None:
        """Drop what is left (the attempt failed and will be retried)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()
