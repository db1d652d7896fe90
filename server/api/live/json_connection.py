"""One JSON WebSocket connection: the live stream of stream.py, rendered as JSON frames, and the client
frames of docs/protocol.md §6 (say, tool_result, resync) with their acks and errors."""
from __future__ import annotations

import logging
import os
from typing import Any

from starlette.websockets import WebSocketDisconnect

from ... import vocab
from ...engine.store import frame_text
from ...errors import AppError
from ...log.failures import StorageError
from .json_frames import BadFrame, ByteBudget, ClientFrame, ack_text, error_text, parse_client_frame
from .stream import STORAGE_DOWN, STORAGE_LOST, UNAVAILABLE, Stream

__all__ = ["QUEUE_FRAMES", "STORAGE_DOWN", "STORAGE_LOST", "UNAVAILABLE", "Connection"]

logger = logging.getLogger(__name__)

# A connection's bound: frames waiting to be written before it is cut off (1013); AGENT_WORLD_WS_QUEUE_FRAMES.
QUEUE_FRAMES = max(10, int(os.environ.get("AGENT_WORLD_WS_QUEUE_FRAMES") or 1000))
MAX_BAD_IN_A_ROW = 50  # malformed frames in a row before the connection is closed with 1008
# What resyncs may make us send: 1 MB a second on average, 8 MB at once (a whole log replay is charged).
REPLAY_RATE, REPLAY_BURST = 1_000_000.0, 8_000_000.0


class Connection(Stream):
    """The JSON socket: every event is its own frame, the bus's text as it is (never re-serialized)."""

    queue_frames = QUEUE_FRAMES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._bad_in_a_row = 0
        self._replay_budget = ByteBudget(REPLAY_RATE, REPLAY_BURST)

    # -- rendering ---------------------------------------------------------------
    def replayed(self, event: dict[str, Any]) -> str:
        return frame_text({"type": "event", "event": event})

    def live_event(self, text: str) -> str:
        return text

    def live_other(self, text: str) -> str:
        return text

    def notice(self, code: str, message: str) -> str:
        return error_text(code, message)

    def reset_notice(self, end: int) -> str:
        return frame_text({"type": "reset", "after": end, "message": f"{STORAGE_LOST} after seq {end}"})

    async def send_state(self) -> None:
        snapshot = await self.ctx.engine.snapshot(self.world)
        await self.replay(until=snapshot["last_seq"])  # every event the snapshot reflects comes before it
        snapshot["members"] = self.ctx.presence.members(self.world)
        await self.emit(frame_text(snapshot))

    # -- client frames -------------------------------------------------------------
    async def on_message(self, message: dict[str, Any]) -> bool:
        try:
            frame = parse_client_frame(message)
        except BadFrame as exc:
            self.ctx.metrics.errors.labels("ws_bad_frame").inc()
            self._bad_in_a_row += 1
            if self._bad_in_a_row >= MAX_BAD_IN_A_ROW:
                await self.close(1008, f"{MAX_BAD_IN_A_ROW} malformed frames in a row")
                return False
            await self.reply(error_text(vocab.INVALID, exc.message, exc.ref))
            return True
        self._bad_in_a_row = 0
        await self._handle(frame)
        return True

    async def _handle(self, frame: ClientFrame) -> None:
        try:
            reply = await self._apply(frame)
        except AppError as exc:
            await self.reply(error_text(exc.code, exc.message, frame.ref))
            return
        except StorageError:
            self.ctx.metrics.errors.labels("ws_storage").inc()
            await self.reply(error_text(UNAVAILABLE, f"{STORAGE_DOWN}: try again shortly", frame.ref))
            return
        except (WebSocketDisconnect, OSError):
            raise
        except Exception:
            logger.exception("websocket frame %s failed in %s", frame.type, self.world)
            self.ctx.metrics.errors.labels("ws_internal").inc()
            await self.reply(error_text("internal", "the server failed to handle this frame", frame.ref))
            return
        if frame.ref is not None:
            await self.reply(ack_text(frame.ref, **reply))

    async def _apply(self, frame: ClientFrame) -> dict[str, Any]:
        """Do what the frame asks; returns what its ack carries."""
        engine, fields = self.ctx.engine, frame.fields
        if frame.type == "say":
            event = await engine.post_message(self.world, self.actor, fields["content"], fields["chat"])
            return {"seq": event["seq"], "id": event.get("id")}
        if frame.type == "tool_result":
            event = await engine.submit_tool_result(self.world, self.actor, fields["message"])
            return {"seq": event["seq"], "id": event.get("id")}
        await self._resync(fields["after"])
        return {"last_seq": self.last_seq}

    async def _resync(self, after: int | None) -> None:
        """The events after `after` (when given), then a snapshot.

        What a resync sends is charged against the connection's replay budget: a client that asks for
        the whole log again and again gets `too_many_requests` errors until the budget has refilled.
        """
        wait = self._replay_budget.wait()
        if wait > 0:
            self.ctx.metrics.errors.labels("ws_resync_limited").inc()
            raise AppError("too_many_requests",
                           f"resync sends too much: try again in {wait:.1f} s", status=429)
        async with self._lock:
            before = self._sent
            try:
                if after is not None:
                    self.last_seq = min(after, self.last_seq)
                    await self.replay()
                await self.send_state()
                await self.flush()
            finally:
                self._replay_budget.charge(self._sent - before)
