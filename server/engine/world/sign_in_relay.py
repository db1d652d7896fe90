"""An OAuth callback that reaches another process than the one whose sign-in it finishes (the distributed
mode, behind a balancer without affinity). The sign-in's flow, with its PKCE verifier, stays where it
started; the callback's parameters and the browser's person travel to it over the bus, on channels named
by a digest of the `state`, and its outcome comes back the same way.

The starting process listens while the sign-in waits (`serve`); a process that does not hold the state
asks (`relay`): the holder says "taken" at once, then how it went. Nobody answering within `ACK_WAIT`
means nobody holds it: unknown, used or expired.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from ... import vocab
from ...bus import Bus, Gap, Overflow
from ...errors import AppError

ACK_WAIT = 5.0  # seconds a relayed callback waits for the process that holds its sign-in to say so
# (the callback's parameters, the browser's person) -> (world, server, "" or why it failed); AppError refuses
Handler = Callable[[dict[str, str], "str | None"], Awaitable[tuple[str, str, str]]]


def _channels(state: str) -> tuple[str, str]:
    digest = hashlib.sha256(state.encode()).hexdigest()[:32]
    return f"mcp-sign-in:{digest}", f"mcp-sign-in-reply:{digest}"


async def _next(sub: Any) -> dict[str, Any] | None:
    """The next message of a subscription, or None for a gap or one that is not a JSON object."""
    try:
        message = json.loads(await sub.get())
    except (Gap, Overflow, ValueError):
        return None
    return message if isinstance(message, dict) else None


async def serve(bus: Bus, state: str, handle: Handler, ready: asyncio.Event, ended: asyncio.Future[Any]) -> None:
    """Take the callbacks for `state` that other processes relay, until the sign-in has `ended`."""
    asks, replies = _channels(state)
    async with bus.subscribe(asks, maxsize=16) as sub:
        ready.set()
        while not ended.done():
            getting = asyncio.ensure_future(_next(sub))
            await asyncio.wait([getting, ended], return_when=asyncio.FIRST_COMPLETED)
            if not getting.done():
                getting.cancel()
                return
            message = getting.result()
            if message is None:
                continue
            await bus.publish(replies, json.dumps({"status": "taken"}))
            params = {k: str(v) for k, v in (message.get("params") or {}).items() if isinstance(k, str)}
            identity = message.get("identity") if isinstance(message.get("identity"), str) else None
            try:  # not cut short by the end of the sign-in: its outcome is what the asker waits for
                world, server, reason = await asyncio.shield(handle(params, identity))
                reply: dict[str, Any] = {"status": "done", "world": world, "server": server, "reason": reason}
            except AppError as exc:
                reply = {"status": "refused", "code": exc.code, "message": exc.message, "http": exc.status}
            await bus.publish(replies, json.dumps(reply))


async def relay(bus: Bus, state: str, params: dict[str, str], identity: str | None,
                wait: float) -> tuple[str, str, str]:
    """Hand a callback to the process that holds its sign-in; (world, server, reason) as it answers."""
    asks, replies = _channels(state)
    unknown = AppError(vocab.NOT_FOUND, "this sign-in is unknown, already used or expired: "
                                        "start it again from the world's page", 404)
    async with bus.subscribe(replies, maxsize=16) as sub:
        await bus.publish(asks, json.dumps({"params": params, "identity": identity}))
        deadline = ACK_WAIT
        while True:
            try:
                async with asyncio.timeout(deadline):
                    answer = await _next(sub)
            except TimeoutError:
                raise (unknown if deadline == ACK_WAIT else
                       AppError("mcp_sign_in_failed", "the sign-in's process did not answer in time", 502)) from None
            if answer is None:
                continue
            if answer.get("status") == "taken":
                deadline = wait
                continue
            if answer.get("status") == "refused":
                raise AppError(str(answer.get("code")), str(answer.get("message")), int(answer.get("http") or 400))
            with contextlib.suppress(KeyError):
                return str(answer["world"]), str(answer["server"]), str(answer.get("reason") or "")
