"""A large bus frame is parsed once per process for its sockets (server/api/live/large_frames.py): every
page and JSON socket of the world gets the same string, and each used to send it to a worker for itself."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from server import offload
from server.api.live import large_frames


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each trip to a worker, by the length of the text sent (run in a thread here)."""
    sent: list[int] = []

    async def run(work: Callable[[], Any], *, light: bool = False) -> Any:
        sent.append(len(work.args[0]))  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)  # the others ask while it runs
        return await asyncio.to_thread(work)

    monkeypatch.setattr(offload, "run", run)
    return sent


def frame(seq: int, content: str) -> str:
    return "".join(['{"type":"event","event":{"kind":"message","content":"', content, f'","seq":{seq}}}}}'])


async def test_every_socket_shares_one_parse_of_a_frame(trips: list[int]) -> None:
    text = frame(7, "x" * 1000)
    first, second, info = await asyncio.gather(large_frames.shared(text), large_frames.shared(text),
                                               large_frames.event_info(text))
    assert info == (7, "message")
    assert first is second and first["event"]["content"] == "x" * 1000
    assert await large_frames.event_info(text) == (7, "message")  # kept: no second trip
    assert trips == [len(text)]


async def test_an_equal_frame_that_is_another_string_is_parsed_for_itself(trips: list[int]) -> None:
    # Found by identity, so the loop never hashes a 16 MiB string; a copy with the same text (another
    # process's publish, read from Redis) is simply parsed again.
    text = frame(9, "z" * 100)
    again = "".join([text[:10], text[10:]])
    assert again == text and again is not text
    await large_frames.shared(text)
    await large_frames.shared(again)
    assert len(trips) == 2
