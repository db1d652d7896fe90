"""How webhooks and pushes are tried again (server/webhooks/client.py `post_retrying`): while the target is
down or busy, within the time the backoff allows, and never sooner than a target asks."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp

from server.webhooks.client import Backoff, Tried, post_once, post_retrying, session
from server.webhooks.targets import RefusedTarget

QUICK = Backoff(retry_for=5.0, first_wait=0.001, max_wait=0.002)
Answer = tuple[int, str | None] | BaseException


def answering(*answers: Answer) -> tuple[Callable[[], Awaitable[tuple[int, str | None]]], list[int]]:
    """A post that gives `answers` in turn (raising those that are exceptions), and the count of its tries."""
    tries: list[int] = []

    async def post() -> tuple[int, str | None]:
        tries.append(len(tries) + 1)
        answer = answers[len(tries) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer
    return post, tries


async def test_a_target_that_is_down_is_tried_until_it_takes_the_delivery() -> None:
    post, tries = answering((503, None), (502, None), (201, None))
    assert await post_retrying(post, QUICK) == Tried(3, 201, "")
    assert tries == [1, 2, 3]


async def test_no_connection_and_no_answer_in_time_are_tried_again() -> None:
    post, _ = answering(aiohttp.ClientConnectionError("refused"), TimeoutError(), (200, None))
    tried = await post_retrying(post, QUICK)
    assert tried.taken and tried.attempts == 3


async def test_a_refusal_that_would_not_change_is_tried_once() -> None:
    for status in (400, 401, 404, 410, 307):  # a redirect is never followed, nor tried again
        post, tries = answering((status, None))
        tried = await post_retrying(post, QUICK)
        assert (tried.attempts, tried.status, tried.error, tried.taken) == (1, status, f"HTTP {status}", False)
        assert tries == [1]


async def test_a_busy_target_is_not_asked_sooner_than_it_said() -> None:
    # It asks for 5 s; the backoff would try again after a millisecond, but gives up at 1 s: no second try.
    post, tries = answering((429, "5"), (201, None))
    assert await post_retrying(post, Backoff(retry_for=1.0, first_wait=0.001)) == Tried(1, 429, "HTTP 429")
    assert tries == [1]


async def test_a_retry_after_that_is_a_date_is_read_as_none() -> None:
    post, _ = answering((503, "Wed, 21 Oct 2026 07:28:00 GMT"), (201, None))
    assert (await post_retrying(post, QUICK)).attempts == 2


async def test_tries_end_when_the_backoff_runs_out() -> None:
    post, tries = answering(*[(500, None)] * 1000)
    tried = await post_retrying(post, Backoff(retry_for=0.3, first_wait=0.01, max_wait=0.01))
    assert not tried.taken and tried.status == 500 and 2 <= tried.attempts == len(tries) < 1000


async def test_an_address_refused_at_a_later_try_ends_the_delivery() -> None:
    # A name may resolve elsewhere between two tries: the checked resolver refuses it, and that is final.
    post, tries = answering((503, None), RefusedTarget("hooks.example resolves to a loopback address"), (201, None))
    tried = await post_retrying(post, QUICK)
    assert tried == Tried(2, None, "hooks.example resolves to a loopback address")
    assert tries == [1, 2]


async def test_a_url_that_is_none_is_tried_once() -> None:
    post, tries = answering(aiohttp.InvalidURL("not a url"), (201, None))
    tried = await post_retrying(post, QUICK)
    assert (tried.attempts, tried.taken, tried.error) == (1, False, "InvalidURL") and tries == [1]


async def test_a_status_whose_body_is_cut_off_is_still_the_answer() -> None:
    # The target answers its status and headers, then closes before the body it announced: that status
    # (a 503 with when to come back, or a 2xx that took the delivery) is what the try records.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        status = b"503 Busy\r\nRetry-After: 7" if head.startswith(b"POST /busy") else b"200 OK"
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 1000\r\n\r\ncut off")
        await writer.drain()
        writer.close()

    async with _target(answer) as post:
        for path, answered in (("/busy", (503, "7")), ("/ok", (200, None))):
            assert await post(path, 5.0) == answered


async def test_a_target_s_endless_answer_is_not_read_past_its_bound() -> None:
    # Any target may answer a 2xx with gigabytes, slowly: the post reads 64 KiB of it, not the rest.
    sent: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece, total = b"x" * (1 << 20), 0
        try:
            while total < 64 << 20:  # (a bound of the test's own: the old code read all of it)
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                total += len(piece)
        except ConnectionError:
            pass  # the post went away
        finally:
            sent.set_result(total)
            writer.close()

    async with _target(answer) as post:
        assert await post("/", 60.0) == (200, None)
        assert await asyncio.wait_for(sent, timeout=60) < 32 << 20


Answering = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _target(answer: Answering) -> AsyncIterator[Callable[[str, float], Awaitable[tuple[int, str | None]]]]:
    """A target on loopback that answers each post with `answer` (raw HTTP), and one try of a post to a path
    of it within some seconds."""
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, session(checked=False) as posting:
        yield lambda path, seconds: post_once(posting, f"http://127.0.0.1:{port}{path}", b"{}", {}, seconds,
                                              checked=False)
