"""AG-UI (https://docs.ag-ui.com): `POST /api/worlds/{world}/agui` (routed by agui/routes.py), so frontends
built for it (CopilotKit and others) can attach to a world's chat. docs/protocol.md §5 "AG-UI" is the
contract; in short:

- The body is AG-UI's `RunAgentInput`. `threadId` names the chat (an unknown one means the newest chat).
- What the run brings in: the trailing `tool` messages of `messages` answer approval requests (or client
  tools), each through the engine's `submit_tool_result` (the same ownership checks as every decision);
  otherwise a trailing `user` message is posted as the caller's message. Refusals are HTTP errors (§9),
  before any event is streamed.
- The answer is an SSE stream: RUN_STARTED, a MESSAGES_SNAPSHOT (the chat's history, agui/history.py), a
  STATE_SNAPSHOT (agents and their states, pending approvals), the chat's pending approvals, then its live
  activity as TEXT_MESSAGE_START/CONTENT/END (streamed LLM text), TOOL_CALL_START/ARGS/END (agents' tool
  calls) and TOOL_CALL_RESULT (their results), a STATE_SNAPSHOT per status change,
  and RUN_FINISHED once every agent that was busy is idle or waits for a person.
- Human in the loop: an approval request is a call of the frontend tool `requestApproval` (its id is the
  approval id, its arguments the request). The run then ends; the client answers with a `tool` message
  whose content is a decision (`{"decision": "approve", "scope": "once"}`) in its next run.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from ag_ui.core import (
    BaseEvent,
    MessagesSnapshotEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StateSnapshotEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.core import Message as AguiMessage
from ag_ui.encoder import EventEncoder
from pydantic import ValidationError
from starlette.responses import StreamingResponse

from ... import vocab
from ...bus.base import Gap, Overflow, Subscription
from ...errors import AppError
from ..bodies import json_body
from ..http import Call
from .history import chat_events, snapshot_messages

APPROVAL_TOOL = "client.requestApproval"
FRONTEND_APPROVAL_TOOL = "requestApproval"  # the name AG-UI frontends register and answer
START_WAIT = 10.0  # seconds for an agent to start after the input before the run ends as having nothing to do
RUN_LIMIT = 600.0  # seconds a run streams at most; the client starts another run to go on
WAITING = frozenset({vocab.IDLE, vocab.WAITING_APPROVAL, vocab.ERROR})  # nothing more comes without a person


async def agui_run(call: Call) -> StreamingResponse:
    actor, world, engine = call.actor, call.world or "", call.ctx.engine
    body = await json_body(call.request)
    try:
        run = RunAgentInput.model_validate(body)
    except ValidationError as exc:
        raise AppError(vocab.INVALID, f"not an AG-UI RunAgentInput: {exc.errors()[0]['msg']} at "
                       f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}") from None
    chats = [c["id"] for c in await engine.list_chats(world)]
    chat = run.thread_id if run.thread_id in chats else await engine.latest_chat(world)
    answers, said = _new_input(run)
    if answers:
        await engine.require_to_decide(world, actor)
    elif said is not None:
        await engine.require_to_send(world, actor)
    encoder = EventEncoder(accept=call.request.headers.get("accept") or "text/event-stream")
    # Subscribe before acting: whatever the input causes is in the subscription.
    stack = contextlib.AsyncExitStack()
    sub = await stack.enter_async_context(engine.subscribe(world))
    try:
        # The history as it was before this input: what the input causes comes live, after the snapshot
        # (an event in both, appended meanwhile by someone else, is sent once: see `_Run.seen`).
        history = await chat_events(engine, world, chat)
        for answer in answers:
            await engine.submit_tool_result(world, actor, answer)
        if said is not None:  # the snapshot holds it (stored, with its id), in place of the client's copy
            history.append(await engine.post_message(world, actor, said, chat))
    except BaseException:
        await stack.aclose()
        raise
    stream = _Run(call, run, chat, sub, snapshot_messages(history), acted=bool(answers) or said is not None)

    async def body_stream() -> AsyncIterator[str]:
        async with stack:
            async for event in stream.events():
                yield encoder.encode(event)

    return StreamingResponse(body_stream(), media_type=encoder.get_content_type(),
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _new_input(run: RunAgentInput) -> tuple[list[dict[str, Any]], str | None]:
    """(the trailing tool messages as decisions to submit, or else the trailing user message's text)."""
    answers: list[dict[str, Any]] = []
    for message in reversed(run.messages):
        if message.role != "tool":
            break
        answers.insert(0, {"role": "tool", "tool_call_id": message.tool_call_id, "content": _text(message.content)})
    if answers:
        return answers, None
    last = run.messages[-1] if run.messages else None
    if last is not None and last.role == "user":
        return [], _text(last.content)
    return [], None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = [getattr(p, "text", None) for p in content or []]
    return "".join(p for p in parts if isinstance(p, str))


class _Run:
    """Turns the world's live frames for one chat into AG-UI events, until the agents are done."""

    def __init__(self, call: Call, run: RunAgentInput, chat: str, sub: Subscription, history: list[AguiMessage],
                 acted: bool) -> None:
        self.call, self.run, self.chat, self.sub, self.history, self.acted = call, run, chat, sub, history, acted
        # The snapshot replaces the client's messages: what it holds is not sent again, and what it leaves
        # out (a pending request the client was shown before) is announced again.
        self.seen = {m.id for m in history}
        self.known = {c.id for m in history if m.role == "assistant" for c in m.tool_calls or []}
        self.world = call.world or ""
        self.states: dict[str, str] = {}
        self.busy_seen = False
        self.streaming: dict[str, str] = {}  # text messages started and not ended: the text sent so far
        self.names: dict[str, str | None] = {}  # who speaks in each streamed message
        self.resync = False  # a message's streamed text went wrong: send the chat's messages again
        # Calls the client already has a result for (its own answers): no second tool message for them.
        self.answered = {m.tool_call_id for m in [*run.messages, *history] if m.role == "tool"}

    async def events(self) -> AsyncIterator[BaseEvent]:
        yield RunStartedEvent(thread_id=self.run.thread_id, run_id=self.run.run_id)
        yield MessagesSnapshotEvent(messages=self.history)
        snapshot = await self.call.ctx.engine.snapshot(self.world)
        self.states = {a["name"]: a["status"]["state"] for a in snapshot["agents"]}
        yield self._state(snapshot["pending_approvals"])
        for entry in snapshot["pending_approvals"]:  # asked before this run, not yet known to the client
            request = _request_event(entry)
            if request.get("chat") == self.chat:
                for event in self._approval(request):
                    yield event
        try:
            async with asyncio.timeout(RUN_LIMIT):
                async for event in self._live():
                    yield event
        except TimeoutError:
            pass
        except (Gap, Overflow):
            yield RunErrorEvent(message="the world's live stream was interrupted: run again",
                                code="storage_unavailable")
            return
        for message_id in sorted(self.streaming):
            yield TextMessageEndEvent(message_id=message_id)
        yield RunFinishedEvent(thread_id=self.run.thread_id, run_id=self.run.run_id)

    async def _live(self) -> AsyncIterator[BaseEvent]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not self._done():
            wait = None if self.busy_seen else max(0.0, START_WAIT - (loop.time() - started)) if self.acted else 0.0
            try:
                text = await asyncio.wait_for(self.sub.get(), wait)
            except TimeoutError:
                return  # nothing started: nothing to wait for
            except Gap as gap:
                if gap.down:
                    raise
                # A message the bus did not carry (Bus.missed), with the storage up: what it said is in the
                # log and on the status board. The run catches up from there and goes on.
                for event in await self._caught_up():
                    yield event
                continue
            for event in await self._translate(json.loads(text)):
                yield event

    async def _caught_up(self) -> list[BaseEvent]:
        engine = self.call.ctx.engine
        snapshot = await engine.snapshot(self.world)
        self.states = {a["name"]: a["status"]["state"] for a in snapshot["agents"]}
        # Busy in this chat, as a live status frame would count it (one of another chat is not the run's).
        if any(a["status"]["state"] not in WAITING and a["status"].get("chat") in (None, self.chat)
               for a in snapshot["agents"]):
            self.busy_seen = True
        history = snapshot_messages(await chat_events(engine, self.world, self.chat))
        stored = {m.id for m in history}
        self.seen |= stored
        self.known |= {c.id for m in history if m.role == "assistant" for c in m.tool_calls or []}
        self.answered |= {m.tool_call_id for m in history if m.role == "tool"}
        # The snapshot replaces the client's messages (it keeps those the snapshot holds): a text still
        # streaming is ended before it and, not stored yet, started again after it with its text so far;
        # the pending requests (never in the history) are announced again.
        out: list[BaseEvent] = [TextMessageEndEvent(message_id=message_id) for message_id in sorted(self.streaming)]
        out += [MessagesSnapshotEvent(messages=history), self._state(snapshot["pending_approvals"])]
        for message_id, text in list(self.streaming.items()):
            if message_id in stored:
                del self.streaming[message_id]
                continue
            out.append(TextMessageStartEvent(message_id=message_id, role="assistant", name=self.names.get(message_id)))
            if text:
                out.append(TextMessageContentEvent(message_id=message_id, delta=text))
        for entry in snapshot["pending_approvals"]:
            request = _request_event(entry)
            if request.get("chat") == self.chat:
                self.known -= {c["id"] for c in request["tool_calls"] if c["function"]["name"] == APPROVAL_TOOL}
                out += self._approval(request)
        return out

    def _done(self) -> bool:
        return self.busy_seen and all(state in WAITING for state in self.states.values())

    async def _translate(self, frame: dict[str, Any]) -> list[BaseEvent]:
        kind = frame.get("type")
        if kind == "status":
            if frame.get("chat") not in (None, self.chat):
                return []
            self.states[frame["agent"]] = frame["state"]
            if frame["state"] not in WAITING:
                self.busy_seen = True
            pending = await self.call.ctx.engine.pending_approvals(self.world)
            return [self._state(pending)]
        if kind == "chunk" and frame.get("chat") == self.chat and str(frame["message_id"]) not in self.seen:
            message_id = str(frame["message_id"])
            out: list[BaseEvent] = []
            if message_id not in self.streaming:
                self.streaming[message_id] = ""
                self.names[message_id] = frame.get("agent")
                out.append(TextMessageStartEvent(message_id=message_id, role="assistant", name=frame.get("agent")))
            if frame.get("delta"):
                self.streaming[message_id] += frame["delta"]
                out.append(TextMessageContentEvent(message_id=message_id, delta=frame["delta"]))
            return out
        if kind == "event" and frame["event"].get("kind") == "message" and frame["event"].get("chat") == self.chat:
            out = self._message(frame["event"])
            if self.resync:  # a streamed text the stored one does not continue: the log's messages replace it
                self.resync = False
                history = snapshot_messages(await chat_events(self.call.ctx.engine, self.world, self.chat))
                self.seen |= {m.id for m in history}
                out.append(MessagesSnapshotEvent(messages=history))
            if frame["event"].get("decision"):  # the pending list changed (or one more person approved)
                out.append(self._state(await self.call.ctx.engine.pending_approvals(self.world)))
            return out
        return []

    def _message(self, event: dict[str, Any]) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        message_id = str(event["id"])
        if message_id in self.seen:
            return out
        # Sent once: an event can come twice (handed here when the bus failed to publish it, and by Redis
        # if it took it after all), and ahead of its chunks, which then must not start the message again.
        self.seen.add(message_id)
        if event.get("approval"):
            return self._approval(event)
        if event.get("role") == "assistant":
            if message_id in self.streaming:
                # The stored text may have come ahead of its last chunks (through two processes): send the rest.
                sent, stored = self.streaming.pop(message_id), event.get("content") or ""
                if len(stored) > len(sent) and stored.startswith(sent):
                    out.append(TextMessageContentEvent(message_id=message_id, delta=stored[len(sent):]))
                # A retry (a `reset` chunk) streamed its text after the first attempt's, which deltas cannot take back.
                self.resync = not stored.startswith(sent)
                out.append(TextMessageEndEvent(message_id=message_id))
            elif event.get("content"):
                out += [TextMessageStartEvent(message_id=message_id, role="assistant", name=event.get("agent")),
                        TextMessageContentEvent(message_id=message_id, delta=event["content"]),
                        TextMessageEndEvent(message_id=message_id)]
            for call in event.get("tool_calls") or []:
                if vocab.is_client_name(call["function"]["name"]):  # server traffic (an MCP question), as in history
                    self.answered.add(call["id"])  # and so is its answer
                    continue
                out += self._tool_call(call["id"], call["function"]["name"], call["function"]["arguments"],
                                       message_id)
        elif event.get("role") == "tool" and event.get("tool_call_id") not in self.answered | {None}:
            if (event.get("decision") or {}).get("final") is False:
                return out  # one approval of several: the request stays open (the state says who approved)
            self.answered.add(event["tool_call_id"])
            content = event.get("content")
            out.append(ToolCallResultEvent(message_id=message_id, tool_call_id=event["tool_call_id"], role="tool",
                                           content=content if isinstance(content, str) else json.dumps(content)))
        return out

    def _approval(self, event: dict[str, Any]) -> list[BaseEvent]:
        call = next(c for c in event["tool_calls"] if c["function"]["name"] == APPROVAL_TOOL)
        # With the request's `hiddenCharacters` and `warning`, when any: a frontend must warn as the page does.
        request = {**event["approval"], "agent": event.get("agent"), "approvalId": call["id"]}
        return self._tool_call(call["id"], FRONTEND_APPROVAL_TOOL, json.dumps(request), str(event["id"]))

    def _tool_call(self, call_id: str, name: str, arguments: str, parent: str) -> list[BaseEvent]:
        if call_id in self.known:
            return []
        self.known.add(call_id)
        return [ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name, parent_message_id=parent),
                ToolCallArgsEvent(tool_call_id=call_id, delta=arguments),
                ToolCallEndEvent(tool_call_id=call_id)]

    def _state(self, pending: list[dict[str, Any]]) -> StateSnapshotEvent:
        return StateSnapshotEvent(snapshot={
            "world": self.world, "chat": self.chat, "agents": dict(self.states),
            "pendingApprovals": [_pending(_request_event(e), e.get("approved_by")) for e in pending]})


def _request_event(entry: dict[str, Any]) -> dict[str, Any]:
    """A pending approval as the engine lists it: the request event, or an entry holding it in `message`."""
    message = entry.get("message", entry)
    return message if isinstance(message, dict) else entry


def _pending(event: dict[str, Any], approved_by: list[str] | None) -> dict[str, Any]:
    call_id = next(c["id"] for c in event["tool_calls"] if c["function"]["name"] == APPROVAL_TOOL)
    entry = {"approvalId": call_id, "agent": event.get("agent"), "chat": event.get("chat"), **event["approval"]}
    return entry | ({"approvedBy": approved_by} if approved_by is not None else {})


