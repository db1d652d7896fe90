"""The JSON WebSocket of docs/protocol.md §6: `GET /api/worlds/{world}/ws?after=SEQ`.

- Admission, the registry, the stall sweeper and the stream itself are shared with the page's socket
  (live/serve.py, stream.py): a foreign `Origin` → 403, no valid credentials → 401, no role in the
  world → 403, no such world → 404, `after` not a non-negative integer → 400.
- The connection subscribes to the world's bus channel first, then replays the log after `after`, then
  sends a `snapshot`, then live frames: no gap, no duplicate (see stream.py).
- `say`, `tool_result` and `resync` frames get an `ack` when they carry a `ref` (say/tool_result: the
  resulting event's `seq` and `id`; resync: `last_seq`); refusals and malformed frames get an `error`
  frame (`code`, `message`, `ref`) and the connection stays open. `resync` without `after` sends a snapshot;
  with `after`, the events after it first. The ack of a say may arrive before its event frame.
- Closing codes: 1008 for a flood (more than 20 frames a second beyond a burst of 60) or 50 malformed
  frames in a row; 1013 for a client that fell QUEUE_FRAMES behind or left a write blocked for
  `stall_seconds()` (reconnect with `after=`: the close is made at the transport, see transport.py, so a
  client that does not read cannot keep its socket); 1012 when the server shuts down; 1000 after a
  `world_deleted` event. `resync` is charged against a byte budget (live/json_connection.py). Keepalive pings
  come from uvicorn
  (`ws_ping_interval=20` in server/cli.py): a client that stops answering them is dropped.
"""
from __future__ import annotations

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from .json_connection import QUEUE_FRAMES, Connection
from .serve import Registry, close_all, registry_of, serve

__all__ = ["QUEUE_FRAMES", "Registry", "close_all", "registry_of", "routes", "world_socket"]



def routes() -> list[BaseRoute]:
    return [WebSocketRoute("/api/worlds/{world}/ws", world_socket)]


async def world_socket(websocket: WebSocket) -> None:
    await serve(websocket, Connection)
