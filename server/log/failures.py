"""Storage that cannot be used right now (full disk, read-only folder, Redis down): one name for it.

Callers retry what must not be lost (a tool's result), end what can end (a turn), and answer HTTP
with 503; `is_storage_error` recognises the errors each log implementation lets through.
"""
from __future__ import annotations

import sqlite3


class StorageError(Exception):
    """The log could not be read or written; the message is the storage's own (e.g. "database or disk is full")."""


def _storage_errors() -> tuple[type[BaseException], ...]:
    import redis

    return StorageError, sqlite3.Error, redis.RedisError


STORAGE_ERRORS = _storage_errors()


def is_storage_error(exc: BaseException) -> bool:
    return isinstance(exc, STORAGE_ERRORS)
