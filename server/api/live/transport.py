"""Ending a WebSocket at the transport: a client that does not read must not keep its socket.

The ASGI server (uvicorn) waits for its write buffer to drain before it writes anything, a close
frame included, and closing a transport flushes that buffer first: a client that stops reading
would keep its connection and file descriptor for as long as it likes. So, at a bound, we put the
close frame straight into the transport, close it (what is buffered still goes to a client that
reads again), and abort it after a grace period, which releases the descriptor whatever the client does.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

logger = logging.getLogger(__name__)


def stall_seconds() -> float:
    """How long a client may leave a write blocked, or a close unread (`AGENT_WORLD_WS_STALL_SECONDS`, 30)."""
    try:
        return max(0.1, float(os.environ.get("AGENT_WORLD_WS_STALL_SECONDS", "30")))
    except ValueError:
        return 30.0


def transport_of(websocket: WebSocket) -> asyncio.Transport | None:
    """The connection's transport (see `protocol_of`)."""
    protocol = protocol_of(websocket)
    return None if protocol is None else protocol.transport


def protocol_of(websocket: WebSocket) -> Any:
    """The ASGI server's protocol object serving this connection (one holding its transport), or None.

    ASGI gives an app no transport; uvicorn's `receive` and `send` are methods of its protocol,
    which holds one (middleware may wrap them in closures: those are followed too).
    """
    todo: list[Any] = [getattr(websocket, "_receive", None), getattr(websocket, "_send", None)]
    seen: set[int] = set()
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen or len(seen) > 32:
            continue
        seen.add(id(fn))
        owner = getattr(fn, "__self__", None)
        if isinstance(getattr(owner, "transport", None), asyncio.Transport):
            return owner
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(value):
                todo.append(value)
    return None


SEND_BUFFER = 256 * 1024  # bytes the kernel may hold for one WebSocket client (Linux doubles it)


def bound_send_buffer(websocket: WebSocket) -> None:
    """Cap what the kernel buffers for this client: behind a slow reader, what is queued for it then stays
    in our bounded queue, where falling behind is seen (1013), not in megabytes of socket buffer."""
    transport = transport_of(websocket)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        except OSError:
            logger.debug("could not cap a WebSocket's send buffer", exc_info=True)


def close_frame(code: int, reason: str) -> bytes:
    """A server's (unmasked) WebSocket close frame; the reason is cut to fit a control frame."""
    payload = struct.pack("!H", code) + reason.encode("utf-8")[:123].decode("utf-8", "ignore").encode("utf-8")
    return bytes([0x88, len(payload)]) + payload


def close_at_transport(websocket: WebSocket, code: int, reason: str, grace: float | None = None) -> bool:
    """Queue a close frame behind what is buffered, end the connection, and abort it after `grace` seconds
    (default: `stall_seconds()`). False when no transport could be found (the caller then closes as usual)."""
    transport = transport_of(websocket)
    if transport is None:
        return False
    grace = stall_seconds() if grace is None else grace
    seal = getattr(transport.get_protocol(), "seal", None)  # server/http_edge.py's protocol, under `serve`
    if seal is not None and not transport.is_closing():
        seal(close_frame(code, reason), grace)  # (it aborts at the grace itself)
        return True
    if not transport.is_closing():
        transport.write(close_frame(code, reason))
        transport.close()
    asyncio.get_running_loop().call_later(grace, transport.abort)
    return True


async def close_after_writes(websocket: WebSocket, lock: asyncio.Lock, code: int, reason: str,
                             timeout: float) -> bool:
    """Send a close frame once the frame being written (under `lock`) is out; False when that did not
    happen within `timeout` (a client that does not read) or the socket is gone: the caller then closes
    it at the transport."""
    try:
        async with asyncio.timeout(timeout), lock:
            await websocket.close(code, reason[:120])
        return True
    except (TimeoutError, WebSocketDisconnect, RuntimeError, OSError):
        return False
