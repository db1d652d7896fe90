"""What travels on the JSON WebSocket: checking client frames, flood control, reading live frames cheaply."""
from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ... import offload, vocab
from ...engine.store import frame_text
from ...errors import json_problem, may_hold_surrogates
from . import large_frames

MAX_FRAME_CHARS = 64 * 1024  # a client frame larger than 64 KiB gets an error (uvicorn cuts at 1 MiB: 1009)
MAX_REF_CHARS = 200
EVENT_PREFIX = '{"type":"event"'  # how `Store.append` serializes every event frame (see frame_text)

Ref = str | int | None


class BadFrame(Exception):
    """A client frame that cannot be handled; answered with an `error` frame, the connection stays open."""

    def __init__(self, message: str, ref: Ref = None) -> None:
        super().__init__(message)
        self.message = message
        self.ref = ref


@dataclass(frozen=True)
class ClientFrame:
    type: str  # say | tool_result | resync
    ref: Ref = None
    fields: dict[str, Any] = field(default_factory=dict)


def _ref_of(frame: dict[str, Any]) -> Ref:
    ref = frame.get("ref")
    if ref is None:
        return None
    if isinstance(ref, bool) or not isinstance(ref, (str, int)):
        raise BadFrame("ref must be a string or an integer")
    if isinstance(ref, str) and len(ref) > MAX_REF_CHARS:
        raise BadFrame(f"ref must be at most {MAX_REF_CHARS} characters")
    if isinstance(ref, int) and abs(ref) > 2**53:  # what a JavaScript client can echo back exactly
        raise BadFrame("ref must be an integer of at most 2**53")
    return ref


def parse_client_frame(message: dict[str, Any]) -> ClientFrame:
    """An ASGI `websocket.receive` message as a checked client frame, or `BadFrame`."""
    text = message.get("text")
    if text is None:
        raise BadFrame("binary frames are not accepted: send JSON text frames")
    if len(text) > MAX_FRAME_CHARS or len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME_CHARS:
        raise BadFrame(f"frames are limited to {MAX_FRAME_CHARS} bytes")
    try:
        frame = json.loads(text)
    except (ValueError, RecursionError):
        raise BadFrame("a frame must be one JSON object") from None
    if not isinstance(frame, dict):
        raise BadFrame("a frame must be one JSON object")
    problem = json_problem(frame, strings=may_hold_surrogates(text))
    if problem:
        raise BadFrame(f"a frame {problem}")
    ref = _ref_of(frame)
    kind = frame.get("type")
    if kind == "say":
        content, chat = frame.get("content"), frame.get("chat")
        if not isinstance(content, str):
            raise BadFrame("say needs a string `content`", ref)
        if chat is not None and not isinstance(chat, str):
            raise BadFrame("`chat` must be a chat id", ref)
        return ClientFrame("say", ref, {"content": content, "chat": chat})
    if kind == "tool_result":
        tool_message = frame.get("message")
        if not isinstance(tool_message, dict):
            raise BadFrame('tool_result needs `message`: {"role": "tool", "tool_call_id", "content"}', ref)
        return ClientFrame("tool_result", ref, {"message": tool_message})
    if kind == "resync":
        after = frame.get("after")
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
            raise BadFrame("`after` must be a non-negative integer", ref)
        return ClientFrame("resync", ref, {"after": after})
    shown = kind if isinstance(kind, str) and len(kind) <= 40 else "?"
    raise BadFrame(f"unknown frame type {shown!r}: expected say, tool_result or resync", ref)


def error_text(code: str, message: str, ref: Ref = None) -> str:
    frame: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if ref is not None:
        frame["ref"] = ref
    return frame_text(frame)


def ack_text(ref: Ref, **extra: Any) -> str:
    return frame_text({"type": "ack", "ref": ref, **extra})


@functools.lru_cache(maxsize=1024)
def event_info(text: str) -> tuple[int, str | None]:
    """(seq, kind) of an event frame from the bus.

    Every connection of the world gets the very same string object, so the first one parses it and the
    others hit this cache (a str caches its own hash): one parse per event per process, not per client.
    """
    return _event_info(text)


async def event_info_off_loop(text: str) -> tuple[int, str | None]:
    """`event_info`, with a frame over offload.HEAVY_JSON parsed in a worker, once for all the process's
    streams (parsing a 16 MiB result here held the loop about 50 ms)."""
    if len(text) <= offload.HEAVY_JSON:
        return event_info(text)
    return await large_frames.event_info(text)


def _event_info(text: str) -> tuple[int, str | None]:
    event = orjson.loads(text)["event"]  # (several times faster than json: every event frame passes here)
    return int(event["seq"]), event.get("kind")


def revokes_invite(event: dict[str, Any], invite: str | None) -> bool:
    """Whether `event` revokes `invite`: a socket opened with it must end."""
    return invite is not None and event.get("kind") == vocab.INVITE_REVOKED and event.get("invite_id") == invite


def is_world_deleted(kind: str | None) -> bool:
    return kind == vocab.WORLD_DELETED


class ByteBudget:
    """What a client may make us send on demand: refills at `rate` a second up to `burst`; a charge may
    leave it in debt, and nothing more is granted until the debt is paid back by time."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = burst
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def wait(self) -> float:
        """Seconds until something may be sent again (0: now)."""
        self._refill()
        return 0.0 if self._tokens > 0 else (1 - self._tokens) / self.rate

    def charge(self, amount: float) -> None:
        self._refill()
        self._tokens -= amount


class TokenBucket(ByteBudget):
    """`rate` frames a second on average, bursts of up to `burst`."""

    def take(self) -> bool:
        self._refill()
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
