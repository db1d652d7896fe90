"""Several commands in one write on one pooled connection: the hot paths' pipelines, with fewer layers.

A redis-py pipeline object costs a flush about twice the CPU of the round trip itself (its
command stack, a pure-Python packer, per-command response hooks). The appends and publishes of
a busy server are flushed thousands of times a second, so they pack with hiredis (a declared
dependency, through `redis[hiredis]`) and read their replies here, on a connection of the
client's own pool, with that connection's retry policy (`RETRY_ONCE`: sent once more on a new
connection if it broke) and its socket timeout. Replies come back raw: no response callbacks,
so this suits commands whose raw reply is what the caller wants (EVALSHA, PUBLISH).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hiredis import pack_command
from redis.exceptions import ResponseError

Command = tuple[str | bytes | int, ...]


async def send_commands(client: Any, commands: Sequence[Command]) -> list[object]:
    """Send `commands` (with a plain, non-cluster client) in one write and read every reply, in order;
    an error reply comes back as its exception (a `ResponseError`), as in `execute(raise_on_error=False)`.
    A connection error or timeout raises (after one retry on a new connection, if the client's policy says so)."""
    packed = b"".join([pack_command(command) for command in commands])  # type: ignore[arg-type]  # its stub: a 1-tuple
    pool = client.connection_pool
    connection = await pool.get_connection()

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
        replies: list[object] = await connection.retry.call_with_retry(round_trip, broke)
        return replies
    except BaseException:
        # Cancelled or timed out mid-way, replies may be left unread: never hand the connection on so.
        await connection.disconnect(nowait=True)
        raise
    finally:
        await pool.release(connection)
