"""Concurrent calls to Redis gathered into pipelines: one round trip for everything queued meanwhile.

One awaited command per call caps a process near one round trip per command, and most of the
time goes to redis-py's per-command overhead. A `Pipelined` queues each call and one flusher task
sends everything queued so far as one pipeline, then whatever queued while that was in flight.
Each command stays its own atomic unit (a Lua script, a PUBLISH): batching changes round trips,
not semantics. Calls are sent in the order they were made.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from ...aio import cancel_and_wait

T = TypeVar("T")

# Sends a batch; returns one result (or the exception for that item) per item, in order. If it
# raises, every item of the batch fails with that error.
Send = Callable[[list[T]], Awaitable[list[object]]]


class Pipelined(Generic[T]):
    def __init__(self, send: Send[T], name: str, most: int = 1000) -> None:
        self._send = send
        self._most = most  # items per pipeline at most, so one reply never takes long to read
        self._name = name
        self._queue: list[tuple[T, asyncio.Future[object]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def call(self, item: T) -> object:
        """Queue `item`; its result once the pipeline that carried it came back (or its error)."""
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._queue.append((item, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name=self._name)
        return await done

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:self._most], self._queue[self._most:]
            try:
                results = await self._send([item for item, _ in batch])
            except Exception as exc:  # handed to every caller of the batch
                results = [exc] * len(batch)
            except asyncio.CancelledError:  # closed mid-flight: its callers must not wait for ever
                results = [ConnectionError(f"{self._name} was closed")] * len(batch)
                self._settle(batch, results)
                raise
            self._settle(batch, results)

    @staticmethod
    def _settle(batch: list[tuple[T, asyncio.Future[object]]], results: list[object]) -> None:
        for (_, done), result in zip(batch, results, strict=True):
            if done.done():
                continue  # its caller was cancelled
            if isinstance(result, BaseException):
                done.set_exception(result)
            else:
                done.set_result(result)

    async def close(self, error: Exception) -> None:
        """Stop flushing; calls still queued fail with `error`."""
        await cancel_and_wait(self._flusher)
        self._flusher = None
        batch, self._queue = self._queue, []
        self._settle(batch, [error] * len(batch))
