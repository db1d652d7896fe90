"""Several commands in one write on one connection: the hot paths' pipelines, with fewer layers.

A redis-py pipeline object costs a flush about twice the CPU of the round trip itself (its
command stack, a pure-Python packer, per-command response hooks, taking a connection from the
pool and giving it back). The appends and publishes of a busy server are flushed thousands of
times a second by one flusher task each (`Pipelined`), so each flusher keeps a `Wire`: its own
connection, made like the client's pool makes them (same options: its retry policy `RETRY_ONCE`,
sent once more on a new connection if it broke), packed with hiredis (a declared dependency,
through `redis[hiredis]`). The client's socket timeout bounds the whole round trip instead of each
read and write: redis-py spends a task per write and a timer per reply on it, which cost a
round trip as much CPU as the round trip itself. Replies come back raw: no response callbacks, so
this suits commands whose raw reply is what the caller wants (EVALSHA, PUBLISH, EVAL).
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from hiredis import pack_command
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

Command = tuple[str | bytes | int, ...]


class Wire:
    """One connection of a plain (non-cluster) client, for one sender at a time (a flusher)."""

    def __init__(self, client: Any) -> None:
        self._pool = client.connection_pool
        self._timeout: float | None = self._pool.connection_kwargs.get("socket_timeout")
        self._connection: Any = None  # made on first use; it connects (and reconnects) when it sends

    async def send(self, commands: Sequence[Command]) -> list[object]:
        """Send `commands` in one write and read every reply, in order; an error reply comes back as
        its exception (a `ResponseError`), as in `execute(raise_on_error=False)`. A connection error
        or timeout raises (after one retry on a new connection, if the client's policy says so)."""
        packed = b"".join([pack_command(command) for command in commands])  # type: ignore[arg-type]  # its stub: a 1-tuple
        if self._connection is None:  # the pool's options, but no timeout per read or write (see above)
            self._connection = self._pool.connection_class(**{**self._pool.connection_kwargs, "socket_timeout": None})
        connection = self._connection

        async def round_trip() -> list[object]:
            await connection.send_packed_command(packed)
            replies: list[object] = []
            for _ in commands:
                try:
                    replies.append(await connection.read_response())
                except ResponseError as exc:  # read whole: the stream stays in step
                    replies.append(exc)
            return replies

        async def broke(_error: Exception) -> None:
            await connection.disconnect()

        try:
            async with asyncio.timeout(self._timeout):
                replies: list[object] = await connection.retry.call_with_retry(round_trip, broke)
        except TimeoutError:  # Redis paused, or a network cut: fail fast, as the client's own commands do
            await connection.disconnect(nowait=True)
            raise RedisTimeoutError(f"no reply from Redis within {self._timeout:g} s") from None
        except BaseException:
            # Cancelled or timed out mid-way, replies may be left unread: the next send starts afresh.
            await connection.disconnect(nowait=True)
            raise
        return replies

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.disconnect()
