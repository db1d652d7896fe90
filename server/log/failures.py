"""Storage that cannot be used right now (full disk, read-only folder, Redis down): one name for it.

Both logs, the Redis bus and the session stores raise `StorageError` from every operation the storage
failed, chained to the storage's own error (`raise StorageError(...) from exc`), so callers catch that
one class: they retry what must not be lost (a tool's result), end what can end (a turn), and answer
HTTP with 503. A failed condition of an append is not one: that is `Conflict`, the log's answer.
"""
from __future__ import annotations


class StorageError(Exception):
    """The storage could not be read or written; the message is the storage's own (e.g. "database or disk
    is full"), the storage's exception is the `__cause__`.

    `may_have_stored`: the write may have been stored all the same (Redis timed out, or the connection
    broke, after the command was sent: its answer was lost)."""

    def __init__(self, message: str, *, may_have_stored: bool = False) -> None:
        super().__init__(message)
        self.may_have_stored = may_have_stored
