"""Text frames encoded once per process and written straight to each socket's transport.

A live frame goes to every spectator of a world. Through ASGI each copy would cross Starlette, our
middleware and uvicorn, and websockets would build the same frame bytes again for every socket. Without
permessage-deflate (off in `serve`), a server's text frame is the same bytes for every client. So the
bytes are built once and shared (`frame_bytes`), and `FrameWriter` writes them to uvicorn's
websockets-sansio protocol as its own `send` would: after its flow control lets it, never after a close.
A socket served any other way (another ASGI server, a compressing connection) keeps the ASGI path.
"""
from __future__ import annotations

import struct
from collections import OrderedDict, deque
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.protocol import State

from .transport import protocol_of

_CACHE_SIZE = 64  # recent frames: all sockets of a process write the same few at about the same time
_CACHE_CHARS = 16_384  # larger frames (replays, joined fragments) are encoded where they are written
_cache: OrderedDict[int, tuple[str, bytes]] = OrderedDict()


def encode_text_frame(text: str) -> bytes:
    """A server's (unmasked, uncompressed, final) text frame carrying `text`."""
    payload = text.encode("utf-8")
    n = len(payload)
    if n < 126:
        head = bytes((0x81, n))
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x81, 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 127, n)
    return head + payload


def frame_bytes(text: str) -> bytes:
    """`encode_text_frame(text)`, built once for the same string object however many sockets send it."""
    if len(text) > _CACHE_CHARS:
        return encode_text_frame(text)
    key = id(text)
    hit = _cache.get(key)
    if hit is not None and hit[0] is text:  # the id of a freed string may be reused: check it is the same one
        return hit[1]
    frame = encode_text_frame(text)
    _cache[key] = (text, frame)  # holding `text` keeps its id from being reused while cached
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return frame


class FrameWriter:
    """Writes shared frame bytes to one accepted socket of uvicorn's websockets-sansio implementation."""

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol
        self._written = 0  # bytes written to the transport so far
        self._ends: deque[tuple[int, int]] = deque()  # (bytes written after it, frames) of each write not yet out

    @classmethod
    def of(cls, websocket: WebSocket) -> FrameWriter | None:
        """A writer for this socket, or None where frames must go through ASGI (other servers, or an
        extension such as permessage-deflate that makes each socket's bytes its own)."""
        protocol = protocol_of(websocket)
        if protocol is None or type(protocol).__name__ != "WebSocketsSansIOProtocol":
            return None
        conn = getattr(protocol, "conn", None)
        if getattr(conn, "extensions", None) != [] or getattr(conn, "state", None) is not State.OPEN:
            return None
        return cls(protocol)

    def ready(self) -> bool:
        """Whether a frame written now goes out without waiting: open, and its flow control lets it."""
        return self._protocol.writable.is_set() and self._open()

    def _open(self) -> bool:
        protocol = self._protocol
        return not (protocol.disconnected or protocol.close_sent) and protocol.conn.state is State.OPEN

    async def send(self, texts: list[str], frames: int | None = None) -> None:
        """What uvicorn's `send` does with text frames, with the bytes shared across sockets and the
        frames of one burst in one write (one system call, not one per frame)."""
        await self._protocol.writable.wait()  # its flow control: the transport's buffer is below its high mark
        if not self._open():
            raise WebSocketDisconnect(1006)
        self.write(texts, frames)

    def write(self, texts: list[str], frames: int | None = None) -> None:
        """Write now (the caller checked `ready`, or waited for it in `send`); `frames`: how many of the
        stream's frames these are (joined ones count each; by default one a text)."""
        data = frame_bytes(texts[0]) if len(texts) == 1 else b"".join(map(frame_bytes, texts))
        self._protocol.transport.write(data)
        self._written += len(data)
        self._ends.append((self._written, len(texts) if frames is None else frames))

    def held(self) -> int:
        """Frames the transport still holds (its write buffer): written, not yet taken by the kernel."""
        gone = self._written - self._protocol.transport.get_write_buffer_size()
        while self._ends and self._ends[0][0] <= gone:
            self._ends.popleft()
        return sum(frames for _, frames in self._ends)
