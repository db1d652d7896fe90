"""A client of Agent World's JSON WebSocket (docs/protocol.md §6), usable from any asyncio program.

    async with WorldClient("http://127.0.0.1:8000", "demo", token) as world:
        await world.say("hello @alice")
        async for frame in world.frames():
            ...

One background task owns the connection: it replays from `after`, keeps `last_seq`, reconnects with
backoff after the close codes that invite it (1006, 1011, 1012, 1013) resuming after the last event it
delivered (no gap, no duplicate), and resolves the `ack`/`error` of every frame sent with a `ref`. When
the server says its storage lost events this client delivered, a `reset` frame tells the application.
It never imports the server: only the documented protocol binds the two.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

__all__ = ["RECONNECT_CODES", "Ack", "Approval", "ClientError", "Fatal", "NotConnected", "ProtocolError", "Scope",
           "WorldClient", "WorldState", "ws_url"]

Frame = dict[str, Any]
Scope = Literal["once", "session", "always"]
RECONNECT_CODES = frozenset({1006, 1011, 1012, 1013})  # docs/protocol.md §6 "Limits and close codes"
APPROVAL_TOOL = "client.requestApproval"
_LOST_AFTER = re.compile(r"lost this world's events.*after=(\d+)")  # a 1011's reason (docs/protocol.md §6)


class ClientError(Exception):
    """Base class of this module's errors."""


class NotConnected(ClientError):
    """Nothing was sent: the client is not connected right now."""


class Fatal(ClientError):
    """The server refused the connection for good (401/403/404/400, close 1000/1008)."""


class ProtocolError(ClientError):
    """The server answered a frame with an `error` frame: `code` as in docs/protocol.md §9."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Ack:
    """The server's `ack`: the stored event's `seq` and `id` (for a resync, `last_seq`)."""

    ref: str | int
    seq: int | None = None
    id: str | None = None
    last_seq: int | None = None


@dataclass(frozen=True)
class Approval:
    """A pending approval request (the parsed `approval` of a request event, docs/protocol.md §4)."""

    id: str  # the id a decision answers: approval_<call id>
    agent: str
    chat: str
    tool: str
    arguments: dict[str, Any]
    message: str | None
    options: tuple[str, ...]
    seq: int
    required: int = 1  # distinct people who must approve (the two-person rule)
    approved_by: tuple[str, ...] = ()  # who has approved so far, when several must
    # What the server found hidden or disguised in the arguments (`hiddenCharacters`): shown escaped, warned of.
    hidden: frozenset[str] = frozenset()
    warning: str | None = None

    @classmethod
    def from_event(cls, event: Frame, approved_by: list[str] | None = None) -> Approval | None:
        calls = [c for c in event.get("tool_calls") or [] if c.get("function", {}).get("name") == APPROVAL_TOOL]
        parsed = event.get("approval")
        if not calls or not isinstance(parsed, dict):
            return None
        return cls(id=calls[0]["id"], agent=event.get("agent") or "", chat=event.get("chat") or "",
                   tool=str(parsed.get("toolName")), arguments=dict(parsed.get("toolArguments") or {}),
                   message=parsed.get("message"), options=tuple(parsed.get("options") or ()),
                   seq=int(event.get("seq") or 0), required=int(parsed.get("approvalsRequired") or 1),
                   approved_by=tuple(approved_by or ()), hidden=_characters(parsed.get("hiddenCharacters")),
                   warning=parsed["warning"] if isinstance(parsed.get("warning"), str) else None)


def _characters(described: object) -> frozenset[str]:
    """The characters of `hiddenCharacters` (`["U+0441 CYRILLIC SMALL LETTER ES", …]`)."""
    found: set[str] = set()
    for item in described if isinstance(described, list) else ():
        code = str(item).split(" ", 1)[0].removeprefix("U+")
        try:
            found.add(chr(int(code, 16)))
        except (ValueError, OverflowError):
            continue  # not a code point: nothing to escape for it
    return frozenset(found)


def ws_url(base_url: str, world: str, after: int) -> str:
    """`http(s)://host` → `ws(s)://host/api/worlds/{world}/ws?after=N`."""
    parts = urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"not an http(s) or ws(s) URL: {base_url!r}")
    path = parts.path.rstrip("/") + f"/api/worlds/{world}/ws"
    return urlunsplit((scheme, parts.netloc, path, f"after={after}", ""))


@dataclass
class WorldState:
    """What the client knows of the world: updated from every frame before it is delivered."""

    last_seq: int = 0
    pending: dict[str, Approval] = field(default_factory=dict)  # approval id → request, oldest first
    agents: dict[str, Frame] = field(default_factory=dict)  # name → agent, with its latest `status`
    chats: list[Frame] = field(default_factory=list)
    members: list[Frame] = field(default_factory=list)

    def apply(self, frame: Frame) -> None:
        kind = frame.get("type")
        if kind == "snapshot":
            self.pending = {}
            for entry in frame.get("pending_approvals") or []:
                # Either the request event itself, or an entry holding it in `message` (with `approved_by`).
                event = entry.get("message", entry) if isinstance(entry, dict) else {}
                if approval := Approval.from_event(event, entry.get("approved_by")):
                    self.pending[approval.id] = approval
            self.agents = {a["name"]: dict(a) for a in frame.get("agents") or []}
            self.chats = list(frame.get("chats") or [])
            self.members = list(frame.get("members") or [])
        elif kind == "status":
            self.agents.setdefault(frame["agent"], {"name": frame["agent"]})["status"] = frame
        elif kind == "presence":
            self.members = list(frame.get("members") or [])
        elif kind == "event":
            self._apply_event(frame["event"])

    def _apply_event(self, event: Frame) -> None:
        self.last_seq = max(self.last_seq, int(event["seq"]))
        kind = event.get("kind")
        if kind == "message":
            if approval := Approval.from_event(event):
                self.pending[approval.id] = approval
            elif event.get("role") == "tool" and event.get("tool_call_id") in self.pending:
                decision = event.get("decision") or {}
                if decision.get("final") is False:  # one approval of several: still pending
                    request = self.pending[event["tool_call_id"]]
                    self.pending[request.id] = replace(request, approved_by=tuple(decision.get("voters") or ()))
                else:
                    del self.pending[event["tool_call_id"]]  # decided (by a person, a rule or a timeout)
        elif kind in ("agent_added", "agent_updated"):
            agent = dict(event["agent"])
            agent.setdefault("status", self.agents.get(agent["name"], {}).get("status"))
            self.agents[agent["name"]] = agent
        elif kind == "agent_removed":
            self.agents.pop(event.get("name", ""), None)
        elif kind == "chat_created":
            self.chats.append(event["chat"])


class WorldClient:
    """One world's JSON WebSocket, kept connected. Use as an async context manager."""

    def __init__(self, url: str, world: str, token: str, *, after: int = 0, backoff: float = 0.2,
                 max_backoff: float = 2.0, open_timeout: float = 10.0) -> None:
        self.url, self.world, self._token = url, world, token
        self.state = WorldState(last_seq=after)
        self._backoff, self._max_backoff, self._open_timeout = backoff, max_backoff, open_timeout
        self._ws: ClientConnection | None = None
        self._frames: asyncio.Queue[Frame | BaseException] = asyncio.Queue()
        self._waiting: dict[str | int, asyncio.Future[Ack]] = {}
        self._refs = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.reconnects = 0  # how many times the connection was made again

    # Lifecycle ----------------------------------------------------------------------------------------

    async def __aenter__(self) -> WorldClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect (waiting for the first connection; a refusal raises `Fatal`) and keep connected."""
        await self._open()
        self._task = asyncio.create_task(self._run(), name=f"world-client-{self.world}")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._ws:
            await self._ws.close()
        self._fail_waiting(NotConnected("the client was closed"))

    @property
    def last_seq(self) -> int:
        return self.state.last_seq

    # Receiving ----------------------------------------------------------------------------------------

    async def frames(self) -> AsyncIterator[Frame]:
        """Every frame the server sends (events once each, in seq order, across reconnects), with the
        client's `state` already updated. `ack`/`error` frames with a ref go to the sender instead, and
        a `{"type": "connection", "connected": bool}` frame marks each loss and return of the connection.
        Ends by raising `Fatal` when the server closes for good."""
        while True:
            item = await self._frames.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    async def events(self) -> AsyncIterator[Frame]:
        """Only the persisted events (docs/protocol.md §8), in seq order."""
        async for frame in self.frames():
            if frame["type"] == "event":
                yield frame["event"]

    # Sending ------------------------------------------------------------------------------------------

    async def say(self, content: str, chat: str | None = None, timeout: float = 10.0) -> Ack:
        """Send a human message; returns the ack (its event's seq and id)."""
        frame: Frame = {"type": "say", "content": content}
        if chat:
            frame["chat"] = chat
        return await self.send(frame, timeout)

    async def decide(self, approval_id: str, decision: Literal["approve", "deny"], scope: Scope = "once", *,
                     reason: str | None = None, match: dict[str, str] | None = None,
                     arguments: dict[str, Any] | None = None, timeout: float = 10.0) -> Ack:
        """Decide an approval request (docs/protocol.md §4): `match` globs go with `always`, `arguments`
        (edit before approve) with an approval `once`. Raises `ProtocolError` (e.g. `already_decided`)."""
        content: Frame = {"decision": decision, "scope": scope}
        for key, value in (("reason", reason), ("match", match), ("arguments", arguments)):
            if value:
                content[key] = value
        return await self.tool_result(approval_id, json.dumps(content), timeout=timeout)

    async def tool_result(self, tool_call_id: str, content: str, timeout: float = 10.0) -> Ack:
        """Answer a client tool call or an approval with a `role: "tool"` message."""
        message = {"role": "tool", "tool_call_id": tool_call_id, "content": content}
        return await self.send({"type": "tool_result", "message": message}, timeout)

    async def send(self, frame: Frame, timeout: float = 10.0) -> Ack:
        """Send a frame with a fresh `ref` and wait for its ack. Raises `NotConnected` (nothing was sent)
        or `ProtocolError`. A connection lost before the answer raises `NotConnected` too: the frame may
        or may not have been applied, which the events will tell."""
        ws = self._ws
        if ws is None or not self.connected.is_set():
            raise NotConnected("not connected: nothing was sent")
        ref = next(self._refs)
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._waiting[ref] = future
        try:
            try:
                await ws.send(json.dumps({**frame, "ref": ref}))
            except ConnectionClosed:
                raise NotConnected("the connection closed: nothing was sent") from None
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(ref, None)

    # The connection -----------------------------------------------------------------------------------

    async def _open(self) -> None:
        headers = {"Authorization": f"Bearer {self._token}"}
        try:
            self._ws = await connect(ws_url(self.url, self.world, self.state.last_seq), additional_headers=headers,
                                     open_timeout=self._open_timeout, close_timeout=2, max_size=16 * 2**20)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (400, 401, 403, 404):
                raise Fatal(f"the server refused the connection ({status}): {_error_text(exc)}") from None
            raise
        self.connected.set()

    async def _run(self) -> None:
        delay = self._backoff
        while True:
            try:
                assert self._ws is not None
                await self._pump(self._ws)
                code, reason = self._ws.close_code, self._ws.close_reason or ""
            except ConnectionClosed as exc:
                code, reason = (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else (1006, "")
            if code == 1011 and (resume := _LOST_AFTER.search(reason)):
                # The storage lost the events after that seq (docs/protocol.md §6 `reset`): resume from it.
                self._reset({"type": "reset", "after": int(resume.group(1)), "message": reason})
            self._lost()
            if code not in RECONNECT_CODES:
                self._frames.put_nowait(Fatal(f"the server closed the connection ({code})"))
                return
            while True:  # back off, with jitter, until the server takes us back
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, self._max_backoff)
                try:
                    await self._open()
                except Fatal as exc:
                    self._frames.put_nowait(exc)
                    return
                except (OSError, InvalidStatus, TimeoutError, ConnectionClosed):
                    continue
                self.reconnects += 1
                delay = self._backoff
                self._frames.put_nowait({"type": "connection", "connected": True})
                break

    async def _pump(self, ws: ClientConnection) -> None:
        async for text in ws:
            frame = json.loads(text)
            if not isinstance(frame, dict):
                continue
            kind = frame.get("type")
            if kind in ("ack", "error") and frame.get("ref") in self._waiting:
                future = self._waiting[frame["ref"]]
                if not future.done():
                    if kind == "ack":
                        future.set_result(Ack(ref=frame["ref"], seq=frame.get("seq"), id=frame.get("id"),
                                              last_seq=frame.get("last_seq")))
                    else:
                        future.set_exception(ProtocolError(str(frame.get("code")), str(frame.get("message"))))
                continue
            if kind == "event" and int(frame["event"]["seq"]) <= self.state.last_seq:
                continue  # already delivered before a reconnect
            if kind == "reset":
                self._reset(frame)
                continue
            self.state.apply(frame)
            self._frames.put_nowait(frame)

    def _reset(self, frame: Frame) -> None:
        """The events after `frame["after"]` that this client delivered are not in the log any more: the
        events from there on are new ones. The frame goes on to the application, to drop what it shows."""
        after = int(frame["after"])
        if after < self.state.last_seq:
            self.state.last_seq = after
            self._frames.put_nowait(frame)

    def _lost(self) -> None:
        self.connected.clear()
        self._fail_waiting(NotConnected("the connection was lost before the server answered"))
        self._frames.put_nowait({"type": "connection", "connected": False})

    def _fail_waiting(self, exc: ClientError) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(exc)


def _error_text(exc: InvalidStatus) -> str:
    try:
        return str(json.loads(exc.response.body or b"{}")["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return exc.response.reason_phrase
