"""Runs a server tool call exactly once: claim it in the log, run it, write its result."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from .. import vocab
from ..log import Batched, Claim, Close, Conflict, Op, Open, Tag
from ..tools.base import Tool, ToolContext, ToolError
from ..tools.registry import ToolArgumentError, parse_arguments
from ..vocab import Event
from .calls import CallRef, append_result, error_content
from .status import StatusBoard
from .store import Store

log = logging.getLogger(__name__)

ToolLookup = Callable[[str, str], Awaitable[dict[str, Tool]]]  # (world, agent) -> tools by name


class Executor:
    def __init__(self, store: Store, status: StatusBoard, tools_for: ToolLookup,
                 workspace_for: Callable[[str], Path], instance: str) -> None:
        self.store = store
        self.status = status
        self.tools_for = tools_for
        self.workspace_for = workspace_for
        self.instance = instance  # which process started a call: a dead one's calls were interrupted
        self._tasks: set[asyncio.Task[None]] = set()
        self.running: set[str] = set()  # call ids running in this process
        self._starting: dict[str, int] = {}  # call id -> starts in flight

    def start_item(self, call: CallRef, *, retry: bool = False) -> Batched:
        """A `tool_started` event with the claim to run `call`: append it, then `launch` the call."""
        event = {"kind": vocab.TOOL_STARTED, "call_id": call.id, "tool": call.name, "agent": call.agent,
                 "chat": call.chat, "retry": retry}
        return event, self.claim(call, event, retry=retry)

    def claim(self, call: CallRef, event: Event, ops: Sequence[Op] = (), *, retry: bool = False) -> list[Op]:
        """Mark `event` as the one that starts `call` here; `ops` plus the ops that claim the call."""
        event["instance"] = self.instance  # see vocab.started_by
        claim = vocab.exec_claim(call.id) + (f":retry:{self.instance}" if retry else "")
        claimed = [Claim(claim), Open(vocab.running_key(call.id), new=not retry), Tag(vocab.trail_tag(call.id))]
        return list(dict.fromkeys([*ops, *claimed]))

    async def start(self, call: CallRef, *, retry: bool = False) -> bool:
        """Claim `call` and run it in the background. False if it was claimed before (it runs once)."""
        event, ops = self.start_item(call, retry=retry)
        try:
            await self.start_with(call, event, ops)
        except Conflict:
            return False
        return True

    async def start_with(self, call: CallRef, event: Event, ops: Sequence[Op]) -> Event:
        """Append `event` with `ops`, which must hold the claim to run `call` (see `claim`), and launch it.

        An approving decision starts its call this way: deciding and starting are one write.
        Raises `Conflict` when an op fails; then nothing was written and nothing runs.
        """
        # Counted as starting before the append: a runner woken by this event must see the
        # call as busy here, never as interrupted — even while a second start of the same
        # call (the decision's and the runner's may race) is about to lose its claim.
        self._starting[call.id] = self._starting.get(call.id, 0) + 1
        try:
            stored = await self.store.append(call.world, event, ops)
            self.launch(call)
        finally:
            self._starting[call.id] -= 1
            if not self._starting[call.id]:
                del self._starting[call.id]
        return stored

    def launch(self, call: CallRef) -> None:
        """Run `call` in the background; its claim was just written."""
        self.running.add(call.id)
        task = asyncio.create_task(self._run(call), name=f"tool-{call.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def busy(self, call_id: str) -> bool:
        """Whether this process is starting or running `call_id`."""
        return call_id in self.running or call_id in self._starting

    async def _run(self, call: CallRef) -> None:
        await self.status.set(call.world, call.agent, vocab.RUNNING_TOOL, chat=call.chat, tool=call.name)
        try:
            content = await self._invoke(call)
        except asyncio.CancelledError:
            # Shutting down: the call stays "running" in the log and is reported interrupted on restart.
            self.running.discard(call.id)
            raise
        try:
            await append_result(self.store, call, content, extra_ops=[Close(vocab.running_key(call.id))])
        except Conflict:
            log.warning("tool call %s already had a result", call.id)
        finally:
            self.running.discard(call.id)

    async def _invoke(self, call: CallRef) -> str:
        tool = (await self.tools_for(call.world, call.agent)).get(call.name)
        if tool is None or tool.run is None:
            return error_content(f"tool {call.name!r} is not available")
        try:
            args = parse_arguments(tool, call.arguments)
            ctx = ToolContext(call.world, call.agent, call.chat, self.workspace_for(call.world))
            return await tool.run(args, ctx)
        except (ToolError, ToolArgumentError) as exc:
            return error_content(str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool's bug must not end the agent's turn
            log.exception("tool %s failed", call.name)
            return error_content(f"{call.name} failed: {type(exc).__name__}: {exc}")

    async def stop(self, grace: float = 5.0) -> None:
        """Let running tools finish for `grace` seconds; cancel the rest (they resume as interrupted)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
