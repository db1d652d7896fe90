"""The HTTP client that posts webhooks and pushes to anyone's URL (aiohttp).

Imported where a delivery is first posted, not at start-up: aiohttp is about a tenth of the server's
start. A session made `checked` connects only to addresses `targets.refusal` allows: its resolver checks
the very answer the connection uses, so a name that resolves elsewhere later cannot slip past.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from .targets import WEBHOOK_HINT, RefusedTarget, check_address, check_literal

# What a post may raise when the target fails (connection, protocol, time: TimeoutError is an OSError):
# a failed delivery, not a bug.
FAILURES: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError)
ANSWER_READ = 64 * 1024  # bytes of a target's answer read (and dropped): nothing in it is used


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


async def post_once(session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str], seconds: float,
                    *, checked: bool, hint: str = WEBHOOK_HINT) -> tuple[int, str | None]:
    """One try of a delivery: its status and `Retry-After`. `checked`: an address in the URL is refused as the
    session's resolver refuses names (it is connected to without the resolver). A redirect is never followed:
    the checks see only this URL's address, and a `Location` could name any other. The status is the answer:
    a body that then fails to arrive (cut off, or too slow) does not unsay it."""
    if checked:
        check_literal(urlsplit(url).hostname or "", hint=hint)
    async with session.post(url, data=data, headers=headers, allow_redirects=False,
                            timeout=post_timeout(seconds)) as response:
        with contextlib.suppress(*FAILURES):
            await _read_at_most(response, ANSWER_READ)
        return response.status, response.headers.get("Retry-After")


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> None:
    """Read and drop the answer's body, up to `limit` bytes: a body read to its end frees the connection for
    the next post; a longer one (any target may send gigabytes, slowly) is not waited for, and the
    connection is closed with the response."""
    while limit > 0 and (piece := await response.content.read(limit)):
        limit -= len(piece)


def failure(exc: BaseException) -> str:
    """What failed, without the URL that aiohttp's messages carry (it may be a secret)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"could not connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return type(exc).__name__


@dataclass(frozen=True)
class Backoff:
    """How long a delivery is tried for: `first_wait` seconds between the first two tries, doubling up to
    `max_wait`, and no try begun after `retry_for` seconds."""
    retry_for: float = 600.0
    first_wait: float = 1.0
    max_wait: float = 60.0


@dataclass(frozen=True)
class Tried:
    """A delivery's last try: its status (None when nothing answered) and what failed ("" when it was
    taken: a 2xx), after `attempts` tries."""
    attempts: int
    status: int | None
    error: str

    @property
    def taken(self) -> bool:
        return not self.error


def worth_again(status: int) -> bool:
    """Whether a refusal may pass if tried later: the target is down, or busy (a 4xx other than these,
    or a redirect, which is never followed, says the same every time)."""
    return status >= 500 or status in (408, 429)


def retry_after(value: str | None) -> float:
    """The seconds a `Retry-After` header asks for (0 when absent, or a date rather than seconds)."""
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0


async def post_retrying(post: Callable[[], Awaitable[tuple[int, str | None]]], backoff: Backoff) -> Tried:
    """`post()` (one try: its status and `Retry-After`) until a 2xx, or a refusal trying again would not
    change, or `backoff` says to stop. A try that raises one of FAILURES (no connection, no answer in
    time) is tried again; one refused an address (`RefusedTarget`: a name may resolve elsewhere between
    two tries), or whose URL is none, ends the delivery."""
    loop = asyncio.get_running_loop()
    deadline, wait, attempts = loop.time() + backoff.retry_for, backoff.first_wait, 0
    while True:
        attempts += 1
        status: int | None = None
        asked = 0.0
        try:
            status, after = await post()
            if 200 <= status < 300:
                return Tried(attempts, status, "")
            error, again, asked = f"HTTP {status}", worth_again(status), retry_after(after)
        except RefusedTarget as exc:
            return Tried(attempts, None, str(exc))
        except aiohttp.InvalidURL as exc:  # (a ClientError: but no try will make it a URL)
            return Tried(attempts, None, failure(exc))
        except FAILURES as exc:
            error, again = failure(exc), True
        pause = max(wait, asked)  # a target that says when to come back is not asked sooner
        if not again or loop.time() + pause > deadline:
            return Tried(attempts, status, error)
        await asyncio.sleep(pause)
        wait = min(wait * 2, backoff.max_wait)
