"""What an agent's fresh tool calls lead to (run, ask a person, or an error result), written with its reply."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ... import events, vocab
from ...llm import Reply
from ...log import Batched, Claim, Close, Conflict, Op, Open, Tag
from ...tools.base import Tool
from ...tools.registry import ToolArgumentError, parse_arguments
from ...vocab import Event
from ..approvals.policy import evaluate
from ..calls.refs import CallRef, error_content, result_item
from ..hosting.leases import AgentLease, fenced_out
from ..services import Services
from .memory import AgentMemory, TurnPeople
from .retry_reply import retryable_key
from .routing import addressees


@dataclass(frozen=True)
class Dispatch:
    """What dispatching a fresh tool call writes, and what to do once that is written."""
    item: Batched | None  # an approval request, a start of the call, or its error result; None: wait
    then: Callable[[Event], None] | None = None  # given the written event
    answered: bool = False  # the item is the call's result


class Dispatcher:
    def __init__(self, services: Services, world: str, agent: str, lease: AgentLease, memory: AgentMemory) -> None:
        self.services = services
        self.world = world
        self.agent = agent
        self.lease = lease
        self.memory = memory

    async def dispatch(self, call: CallRef, turn: TurnPeople, note: str | None = None) -> Dispatch:
        """How a fresh call goes on: validated, then run, put to a human, or answered with an error.
        `turn`: whom the reply that made the call answers (they do not count among several approvers)."""
        services = self.services
        tool = (await services.tools_for(self.world, self.agent)).get(call.name)
        if tool is None or vocab.is_client_name(call.name):
            return Dispatch(result_item(call, error_content(f"unknown tool {call.name!r}"),
                                        extra_ops=[Tag(vocab.AUDIT_TAG)], fields={"rejected": True}), answered=True)
        try:
            args = parse_arguments(tool, call.arguments)
        except ToolArgumentError as exc:
            return Dispatch(result_item(call, error_content(f"invalid arguments for {call.name}: {exc}")),
                            answered=True)
        verdict = evaluate(tool, args, agent=call.agent, chat=call.chat,
                           rules=await services.approvals.rules(self.world),
                           grants=await services.approvals.grants(self.world, call.chat))
        if verdict.verdict == "deny":
            return Dispatch(result_item(call, error_content(verdict.reason), extra_ops=[Tag(vocab.AUDIT_TAG)],
                                        fields={"policy": verdict.record(), "not_run": vocab.DENIED}), answered=True)
        if verdict.verdict == "ask":
            required = int(verdict.source.get("approvals_required") or 1)
            return Dispatch(await services.approvals.request_item(call, tool, args, note, required=required,
                                                                  turn=turn),
                            then=lambda approval: services.approvals.schedule_timeout(self.world, approval))
        if call.location == "server":
            # On the record, in the chat and the audit: which rule, grant or default let it run.
            return Dispatch(services.executor.start_item(call, policy=verdict.record()),
                            then=lambda _: services.executor.launch(call))
        return Dispatch(None)  # an allowed client call stays open until a browser answers it

    async def save_reply(self, chat: str, message_id: str, reply: Reply, tools: dict[str, Tool], *,
                         input_seq: int, turn: TurnPeople) -> list[tuple[CallRef, Dispatch]]:
        """Write the LLM's reply together with the dispatch of its tool calls: one write, all or nothing.
        Nothing is written (no call is dispatched) when the chat was deleted meanwhile.

        The reply records what it answers: the last seq of the memory it was made from (`input_seq`: what
        was said after it is still owed an answer) and `turn`, whom it answers."""
        # Read beside the dispatch below, which is CPU work (its reads are memoized): one read less in front
        # of the write. The pause lets the read reach its thread first.
        chat_open = asyncio.ensure_future(self.services.store.log.get_open(self.world, vocab.chat_key(chat)))
        chat_open.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen even if the dispatch failed first
        await asyncio.sleep(0)
        try:
            return await self._save_reply(chat, message_id, reply, tools, chat_open, input_seq, turn)
        finally:
            chat_open.cancel()  # when the dispatch failed first

    async def _save_reply(self, chat: str, message_id: str, reply: Reply, tools: dict[str, Tool],
                          chat_open: asyncio.Future[Event | None], input_seq: int, turn: TurnPeople
                          ) -> list[tuple[CallRef, Dispatch]]:
        agents = [a["name"] for a in await self.services.worlds.agents(self.world)]
        targets = addressees(reply.content, agents, sender_agent=self.agent)
        for attempt in range(3):
            calls = [c.to_openai() for c in reply.tool_calls]
            if (attempt or len({c["id"] for c in calls}) != len(calls)
                    or not all(vocab.SAFE_CALL_ID.match(c["id"]) for c in calls)):
                # The model's ids collided with earlier ones, or are odd: ours are unique and plain.
                for shape in calls:
                    shape["id"] = vocab.new_id("call")
            client = [c["id"] for c in calls if getattr(tools.get(c["function"]["name"]), "location", "") == "client"]
            event = events.agent_reply(message_id, chat, self.agent, reply.content or None, input_seq=input_seq,
                                       to=targets, turn=turn.record(), tool_calls=calls, client_calls=client,
                                       usage=reply.usage)
            # A reply answers: a failed or stopped one before it can no longer be retried.
            ops: list[Op] = [Tag(vocab.memory_tag(chat, self.agent)),
                             Close(retryable_key(self.agent, chat), must_exist=False)]
            refs = CallRef.all_in({**event, "world": self.world})
            for call in refs:
                ops += [Open(call.open_key), Claim(vocab.issued_claim(call.id)), Tag(vocab.trail_tag(call.id))]
            for other in targets:
                ops += [Tag(vocab.memory_tag(chat, other)), Open(vocab.turn_key(other, chat), new=False)]
            if not calls and not await self.memory.heard_since_thinking(chat):
                # Unless a message written since that check opened the turn again: it is owed a reply too.
                ops.append(Close(vocab.turn_key(self.agent, chat), must_exist=False,
                                 unless_reopened_after=self.memory.last_read(chat)))
            dispatched = [(call, await self.dispatch(call, turn, note=reply.content)) for call in refs]
            if await chat_open is None:
                return []
            try:
                await self.write([(event, ops)], [d for _, d in dispatched])
            except Conflict as exc:
                if fenced_out(exc):
                    raise
                continue
            return dispatched
        raise RuntimeError("could not save the LLM reply")

    async def write(self, first: list[Batched], dispatches: list[Dispatch]) -> None:
        """Append `first` and what `dispatches` write in one batch, then do what each says comes after.

        Raises `Conflict` (nothing written, nothing done) when any of them disagrees with the log.
        """
        writing = [(d.item, d.then) for d in dispatches if d.item is not None]
        items = [*first, *(item for item, _ in writing)]
        if items:  # one fence covers the whole batch: it is written all or nothing
            items[0] = (items[0][0], self.lease.fenced(list(items[0][1])))
        def then(written: list[Event]) -> None:  # before the publish: a call that may run starts sooner
            for (_, after), event in zip(writing, written[len(first):], strict=True):
                if after is not None:
                    after(event)
        await self.services.store.append_batch(self.world, items, on_stored=then)
