"""Writes that must not be lost, tried again while the log cannot take them (a full disk, Redis gone)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ...log.failures import StorageError

logger = logging.getLogger(__name__)

FIRST, MAX = 0.5, 5.0  # seconds between tries: doubling from FIRST up to MAX
T = TypeVar("T")


class PastDeadline(Exception):
    """A write still failing when there is no time left to try it again."""


async def until_stored(write: Callable[[], Awaitable[T]], *, what: str,
                       on_retry: Callable[[Exception, float], Awaitable[None]] | None = None,
                       until: Callable[[], float] | None = None) -> T:
    """`write()`, again with backoff while it fails on storage; any other error is raised at once.

    `on_retry(error, delay)` tells whoever waits; `until()` (loop time): raise `PastDeadline` rather
    than try again at or after it.
    """
    loop = asyncio.get_running_loop()
    delay = FIRST
    while True:
        try:
            return await write()
        except StorageError as exc:
            if until is not None and loop.time() + delay >= until():
                raise PastDeadline from exc
            logger.warning("could not %s (%s): trying again in %g s", what, exc, delay)
            if on_retry is not None:
                await on_retry(exc, delay)
        await asyncio.sleep(delay)
        delay = min(MAX, delay * 2)


async def in_background(write: Callable[[], Awaitable[object]], what: str) -> None:
    """`until_stored` for a write nothing else would make later, in a task nobody awaits: any other
    error is logged, and ends it."""
    try:
        await until_stored(write, what=what)
    except Exception:
        logger.exception("could not %s", what)
