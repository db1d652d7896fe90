"""The HTTP client that posts webhooks and pushes to anyone's URL (aiohttp).

Imported where a delivery is first posted, not at start-up: aiohttp is about a tenth of the server's
start. A session made `checked` connects only to addresses `targets.refusal` allows: its resolver checks
the very answer the connection uses, so a name that resolves elsewhere later cannot slip past.
"""
from __future__ import annotations

import socket

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from .targets import WEBHOOK_HINT, check_address

# What a post may raise when the target fails (connection, protocol, time: TimeoutError is an OSError):
# a failed delivery, not a bug.
FAILURES: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError)


class CheckedResolver(AbstractResolver):
    """aiohttp's resolver, refusing the addresses `refusal` names: the check and the connection use one answer."""

    def __init__(self, hint: str = WEBHOOK_HINT) -> None:
        self._inner = ThreadedResolver()
        self._hint = hint  # what the refusal's message suggests

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        for result in found:
            check_address(host, result["host"], self._hint)
        return found

    async def close(self) -> None:
        await self._inner.close()


def session(*, checked: bool, hint: str = WEBHOOK_HINT, limit: int = 100) -> aiohttp.ClientSession:
    """A session for posting deliveries (no proxy from the environment; each post gives its `post_timeout`);
    `checked`: only to allowed addresses."""
    connector = aiohttp.TCPConnector(resolver=CheckedResolver(hint) if checked else None, limit=limit)
    return aiohttp.ClientSession(connector=connector, trust_env=False)


def post_timeout(seconds: float) -> aiohttp.ClientTimeout:
    """One post's time limit, from connecting to the end of the answer."""
    return aiohttp.ClientTimeout(total=seconds)


def failure(exc: BaseException) -> str:
    """What failed, without the URL that aiohttp's messages carry (it may be a secret)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"could not connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return type(exc).__name__
