"""A long WebSocket message leaves `serve`'s edge protocol in fragments, one a turn of the event loop, and
arrives whole (server/http_edge.py `FRAGMENT`). Written as one frame, a finished 1 MB reply (4 MB to each of
its pages) or a 16 MiB tool result held the loop 10-60 ms while every other world waited (bench/isolation.py).
A real uvicorn on loopback, with the edge's protocols; the client reads raw frames (websockets' sans-I/O)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from server.http_edge import FRAGMENT, edge_protocols

Send = Callable[[dict[str, Any]], Coroutine[Any, Any, None]]
Script = Callable[[Send], Awaitable[None]]

LONG_TEXT = (("é" + "x" * 99) * FRAGMENT)[:2 * FRAGMENT] + "end"  # 2 fragments and a bit; not all of it ASCII
LONG_BYTES = bytes(range(256)) * (FRAGMENT // 256) + b"!"


@asynccontextmanager
async def edge_serving(script: Script) -> AsyncIterator[int]:
    """uvicorn with the edge's protocols, whose one WebSocket route runs `script` and closes; its port."""
    async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Send) -> None:
        assert scope["type"] == "websocket"
        await receive()
        await send({"type": "websocket.accept"})
        await script(send)
        await send({"type": "websocket.close", "code": 1000})

    http, ws = edge_protocols(header_timeout=10.0, per_address=0, proxies="")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, http=http, ws=ws, lifespan="off",
                                           ws_per_message_deflate=False, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await serving


async def frames_until_close(port: int) -> list[Frame]:
    """Every data frame the server sends, as it sent them, up to its close frame."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/"), max_size=None)
    client.send_request(client.connect())
    writer.write(b"".join(client.data_to_send()))
    frames: list[Frame] = []
    try:
        while data := await asyncio.wait_for(reader.read(1 << 20), 30):
            client.receive_data(data)
            for event in client.events_received():
                if isinstance(event, Response):
                    assert event.status_code == 101
                    continue
                assert isinstance(event, Frame)
                if event.opcode is Opcode.CLOSE:
                    return frames
                elif event.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                    frames.append(event)
            writer.write(b"".join(client.data_to_send()))  # (pongs)
        raise AssertionError("the connection ended without a close frame")
    finally:
        writer.close()


def messages(frames: list[Frame]) -> list[tuple[int, str | bytes]]:
    """The frames as messages: how many frames each came in, and its text or bytes."""
    out: list[tuple[int, str | bytes]] = []
    parts: list[Frame] = []
    for frame in frames:
        assert (frame.opcode is Opcode.CONT) == bool(parts), "a message began inside another"
        parts.append(frame)
        if frame.fin:
            data = b"".join(part.data for part in parts)
            out.append((len(parts), data.decode() if parts[0].opcode is Opcode.TEXT else data))
            parts = []
    assert not parts, "a message was left unfinished"
    return out


def text(value: str) -> dict[str, Any]:
    return {"type": "websocket.send", "text": value}


async def test_a_long_message_goes_out_in_fragments_and_arrives_whole() -> None:
    async def script(send: Send) -> None:
        for message in (text("first"), text(LONG_TEXT), {"type": "websocket.send", "bytes": LONG_BYTES},
                        {"type": "websocket.send", "text": None, "bytes": LONG_BYTES},  # (ASGI allows both keys)
                        text("x" * FRAGMENT), text("last")):
            await send(message)

    async with edge_serving(script) as port:
        got = messages(await frames_until_close(port))
    assert got == [(1, "first"), (3, LONG_TEXT), (2, LONG_BYTES), (2, LONG_BYTES), (1, "x" * FRAGMENT), (1, "last")]


async def test_messages_sent_together_never_interleave() -> None:
    async def script(send: Send) -> None:
        await asyncio.gather(send(text("a" * 3 * FRAGMENT)), send(text("b" * 2 * FRAGMENT)), send(text("c")))

    async with edge_serving(script) as port:
        got = messages(await frames_until_close(port))
    assert [message for _, message in got] == ["a" * 3 * FRAGMENT, "b" * 2 * FRAGMENT, "c"]


async def test_a_message_cancelled_halfway_is_still_sent_whole() -> None:
    long = "y" * 8 * FRAGMENT

    async def script(send: Send) -> None:
        sending = asyncio.create_task(send(text(long)))
        for _ in range(3):  # a fragment or two are written, one a turn
            await asyncio.sleep(0)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        await send(text("after"))

    async with edge_serving(script) as port:
        got = messages(await frames_until_close(port))
    assert [message for _, message in got] == [long, "after"]
    assert 1 < got[0][0] < 8  # cancelled halfway: the fragments so far, then the rest at once
