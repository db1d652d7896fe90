"""One agent's work loop: its owed turns, one LLM call at a time, its tool calls carried to the end.

Every decision is re-derived from the log on each step, so the same code resumes a turn after a
restart: calls not yet dispatched are dispatched, approved ones run, interrupted ones are reported.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import vocab
from ..aio import cancel_and_wait
from ..errors import AppError
from ..llm import LLMError
from ..llm.retry import complete_with_retries
from ..log import Batched, Claim, Close, Conflict, Fence, Op, Open, Tag
from ..log.failures import is_storage_error
from ..tools.registry import ToolArgumentError, parse_arguments
from ..vocab import Event
from .calls import CallRef, append_result, error_content, result_item
from .chunks import ChunkStream
from .decisions import is_vote
from .policy import evaluate
from .prepare import Entry, prepare_input
from .routing import addressees
from .worlds import DEFAULT_SETTINGS

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)
MAX_BACKOFF = 30.0  # seconds between two tries while the storage fails
INTERRUPTED = "interrupted by restart: the tool may or may not have run; check before retrying"
LEASE_MARGIN = 0.2  # of the lease's ttl (at most 1 s): an unrenewed lease's turn stops this long before it ends


def fenced_out(exc: BaseException) -> bool:
    """Whether a write was refused because this process no longer holds the lease it was made under."""
    return isinstance(exc, Conflict) and exc.reason == "fenced"


@dataclass(frozen=True)
class Dispatch:
    """What dispatching a fresh tool call writes, and what to do once that is written."""
    item: Batched | None  # an approval request, a start of the call, or its error result; None: wait
    then: Callable[[Event], None] | None = None  # given the written event
    answered: bool = False  # the item is the call's result


class AgentRunner:
    def __init__(self, engine: Engine, world: str, agent: str) -> None:
        self.engine = engine
        self.world = world
        self.agent = agent
        self._wake = asyncio.Event()
        self._memory: dict[str, tuple[list[Event], int]] = {}  # chat -> (events, last seq read)
        self._entries: dict[str, dict[int, Entry]] = {}  # chat -> seq -> how that event enters LLM input
        self._first_chat: str | None = None  # the chat of the first open turn, last time we looked
        self.task: asyncio.Task[None] | None = None
        self.holds_lease = False
        self._backoff = 0.0  # seconds before the next try while the storage fails
        self._call: asyncio.Task[Any] | None = None  # the LLM call in flight (see stop_turn)
        self._stopped_by: str | None = None
        self.fence = 0  # the lease's fencing token: every write for a turn carries it (see `_fenced`)
        self._expiry: asyncio.TimerHandle | None = None  # stops the turn before an unrenewed lease ends
        self._lease_lost = False  # the LLM call in flight was cancelled because the lease is gone

    @property
    def lease_name(self) -> str:
        """Only the process holding this lease runs the agent's turns (one LLM turn at a time)."""
        return f"agent:{self.world}/{self.agent}"

    async def renew_lease(self) -> None:
        if self.engine.exclusive:
            self.holds_lease = True
            return
        loop, ttl = asyncio.get_running_loop(), self.engine.lease_ttl
        asked = loop.time()  # the lease runs from when we asked, not from when Redis answered
        token = await self.engine.store.log.lease(self.lease_name, self.engine.instance, ttl, world=self.world)
        if not token:
            if self.holds_lease:
                self._lose_lease("another process took it")
            return
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = loop.call_at(asked + ttl - min(1.0, ttl * LEASE_MARGIN), self._lose_lease,
                                    "it could not be renewed in time")
        if not self.holds_lease or token != self.fence:
            self.wake()
        self.holds_lease, self.fence = True, token

    def _lose_lease(self, why: str) -> None:
        """Stop running this agent's turn: another process may take it over (its writes are fenced anyway)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if not self.holds_lease:
            return
        log.warning("agent %s/%s: lease lost (%s); its turn stops here", self.world, self.agent, why)
        self.holds_lease = False
        if self._call is not None and not self._call.done():
            self._lease_lost = True
            self._call.cancel()

    def _fenced(self, ops: list[Op]) -> list[Op]:
        """`ops` made conditional on still holding the lease (nothing to fence in the embedded mode)."""
        return ops if self.engine.exclusive else [*ops, Fence(self.lease_name, self.fence)]

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop(), name=f"agent-{self.world}-{self.agent}")

    def wake(self) -> None:
        self._wake.set()

    def concerns(self, event: Event) -> bool:
        """Whether `event` may let one of this agent's turns go on, so the runner should look again.

        Not its own replies: their calls were dispatched as they were saved. Nor the bookkeeping
        of approvals and runs: a request or a refusal changes nothing, and a decision is carried
        out by whoever wrote it — its outcome, a tool result, is what wakes the runner.
        """
        kind, role, sender = event.get("kind"), event.get("role"), event.get("sender")
        if kind in (vocab.TOOL_STARTED, vocab.REFUSED) or (role == "tool" and event.get("decision")):
            return False
        return not (role == "assistant" and sender in (self.agent, vocab.SERVER_SENDER))

    async def stop(self) -> None:
        await cancel_and_wait(self.task)
        if self._expiry is not None:
            self._expiry.cancel()
        if self.holds_lease and not self.engine.exclusive:
            self.holds_lease = False
            await self.engine.store.log.release(self.lease_name, self.engine.instance, world=self.world)

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            recheck: float | None = None  # also look again after this long, with or without a wake
            try:
                if not await self.engine.worlds.exists(self.world):
                    return
                progressed = False
                await self.renew_lease()
                turns, memory = await self._turns_and_memory()
                if turns and not self.engine.exclusive:
                    # another process may die holding the lease or a running call: look again later
                    recheck = self.engine.lease_ttl / 2
                for turn in turns if self.holds_lease else ():
                    progressed |= await self._step_or_fail(turn["chat"], memory)
                    memory = None  # read before the first step: stale for the next ones
                self._first_chat = turns[0]["chat"] if turns else None
                self._backoff = 0.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, AppError) and exc.code == vocab.NOT_FOUND:  # the agent or world is gone
                    return
                # The log cannot be used (full disk, Redis down): nothing can be written, not even an
                # agent_error. The step is re-derived from the log, so trying it again later is safe.
                log.warning("agent %s/%s cannot go on: %s: %s", self.world, self.agent, type(exc).__name__, exc)
                self._backoff = min(MAX_BACKOFF, max(1.0, 2 * self._backoff))
                progressed, recheck = False, self._backoff
                await self._set_status_quietly(vocab.ERROR, last_error=f"{type(exc).__name__}: {exc} "
                                                                      f"(trying again in {self._backoff:g} s)")
            if not progressed:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
                # races with the wake-up, and the runner would never stop.
                try:
                    async with asyncio.timeout(recheck):
                        await self._wake.wait()
                except TimeoutError:
                    pass

    async def _step_or_fail(self, chat: str, memory: list[Event] | None) -> bool:
        """`_step`, and when it fails for any reason but the storage's, the turn ends visibly."""
        try:
            return await self._step(chat, memory)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if fenced_out(exc):  # another process runs the turn now: nothing more to write here
                self._lose_lease("a write was fenced out")
                return False
            if is_storage_error(exc) or (isinstance(exc, AppError) and exc.code == vocab.NOT_FOUND):
                raise
            log.exception("agent %s/%s step failed", self.world, self.agent)
            message = exc.message if isinstance(exc, AppError) else f"{type(exc).__name__}: {exc}"
            await self._end_turn(chat, f"{self.agent} stopped after an internal error: {message}")
            return True

    async def _end_turn(self, chat: str, message: str) -> None:
        """Close the turn with an `agent_error` everyone sees; the agent's status says `error`."""
        await self.engine.store.append(self.world, {"kind": vocab.AGENT_ERROR, "chat": chat, "agent": self.agent,
                                                    "message": message},
                                       self._fenced([Close(vocab.turn_key(self.agent, chat), must_exist=False)]))
        await self.engine.status.set(self.world, self.agent, vocab.ERROR, chat=chat, last_error=message)

    async def _set_status_quietly(self, state: str, **extra: Any) -> None:
        try:
            await self.engine.status.set(self.world, self.agent, state, **extra)
        except Exception:  # the bus may be what fails
            log.debug("status of %s/%s not published", self.world, self.agent, exc_info=True)

    def stop_turn(self, by: str) -> bool:
        """Cancel the LLM call in flight (the turn then ends, its partial text kept); False when none is."""
        if self._call is None or self._call.done():
            return False
        self._stopped_by = by
        self._call.cancel()
        return True

    async def _turns_and_memory(self) -> tuple[list[Event], list[Event] | None]:
        """The agent's open turns; with them, if it is still the first, the memory of the chat
        whose turn came first last time — read side by side, so a wake-up waits on one read, not two."""
        turns = self.engine.store.log.list_open(self.world, vocab.turns_of(self.agent))
        if self._first_chat is None or not self.holds_lease:
            return await turns, None
        turns_now, memory = await asyncio.gather(turns, self.memory(self._first_chat))
        return turns_now, memory if turns_now and turns_now[0]["chat"] == self._first_chat else None

    # -- memory --------------------------------------------------------------
    async def memory(self, chat: str) -> list[Event]:
        """This agent's memory of `chat`, read incrementally: no whole-memory reload per turn."""
        tags = [vocab.memory_tag(chat, self.agent), vocab.shared_memory_tag(chat)]
        keep = max(1000, 2 * (await self.engine.worlds.settings(self.world))["context_messages"])
        if chat not in self._memory:
            events = await self.engine.store.log.read_tagged(self.world, tags, limit=keep, newest=True)
        else:
            events, last = self._memory[chat]
            events.extend(await self.engine.store.log.read_tagged(self.world, tags, after=last))
            if len(events) > 2 * keep:
                del events[:-keep]
                entries = self._entries.get(chat, {})
                for seq in [seq for seq in entries if seq < events[0]["seq"]]:
                    del entries[seq]
        self._memory[chat] = (events, events[-1]["seq"] if events else 0)
        return events

    async def _heard_since_thinking(self, chat: str) -> bool:
        """Whether someone spoke to this agent in `chat` after the memory its LLM call was given: then its
        reply must not close the turn, or that message would never be answered."""
        _, last = self._memory.get(chat, ([], 0))
        tags = [vocab.memory_tag(chat, self.agent), vocab.shared_memory_tag(chat)]
        newer = await self.engine.store.log.read_tagged(self.world, tags, after=last, limit=50)
        if not newer:
            return False
        agents = [a["name"] for a in await self.engine.worlds.agents(self.world)]
        return any((e.get("role") == "user" and self.agent in addressees(e.get("content"), agents, sender_agent=None))
                   or (e.get("role") == "assistant" and e.get("sender") not in (self.agent, vocab.SERVER_SENDER))
                   for e in newer)

    def _asker(self, chat: str) -> str | None:
        """Who started the turn in `chat`: the sender of the first person's message since this agent last
        finished a turn there (a reply without tool calls), not whoever spoke last."""
        events, _ = self._memory.get(chat, ([], 0))
        starter = None
        for event in reversed(events):
            if event.get("role") == "assistant" and event.get("sender") == self.agent and not event.get("tool_calls"):
                break
            if event.get("role") == "user" and vocab.member_of(event.get("sender")):
                starter = event["sender"]
        return starter

    def _llm_calls_since_human(self, memory: list[Event]) -> int:
        count = 0
        for event in reversed(memory):
            sender = event.get("sender") or ""
            if vocab.member_of(sender):
                break
            if event.get("role") == "assistant" and sender == self.agent:
                count += 1
        return count

    # -- one step of one turn ------------------------------------------------
    async def _step(self, chat: str, memory: list[Event] | None = None) -> bool:
        """Move the turn in `chat` forward; False when it is waiting on someone else."""
        if memory is None:
            memory = await self.memory(chat)
        answered: set[str] = set()  # tool results since this agent's last reply
        last = None
        for event in reversed(memory):
            if event.get("role") == "assistant" and event.get("sender") == self.agent:
                last = event
                break
            if event.get("role") == "tool":
                answered.add(str(event.get("tool_call_id")))
        if last is not None and last.get("tool_calls"):
            missing = [c for c in CallRef.all_in(last) if c.id not in answered]
            if missing:
                changed = False
                for call in missing:
                    changed |= await self._settle(call)
                if not changed:
                    await self._show_waiting(chat, missing)
                return changed
        return await self._llm_turn(chat, memory)

    async def _show_waiting(self, chat: str, missing: list[CallRef]) -> None:
        pending = await self.engine.approvals.pending(self.world, self.agent)
        if pending:
            await self.engine.status.set(self.world, self.agent, vocab.WAITING_APPROVAL, chat=chat,
                                         pending=len(pending))
        elif any(self.engine.executor.busy(c.id) for c in missing):
            await self.engine.status.set(self.world, self.agent, vocab.RUNNING_TOOL, chat=chat)
        else:
            await self.engine.status.set(self.world, self.agent, vocab.WAITING_APPROVAL, chat=chat,
                                         waiting_for="client")

    async def _settle(self, call: CallRef) -> bool:
        """Bring one unanswered call forward from whatever the log says happened to it."""
        if call.location == "client" or self.engine.executor.busy(call.id):
            return False
        trail = await self.engine.store.log.read_tagged(self.world, [vocab.trail_tag(call.id)])
        if any(e.get("role") == "tool" and not e.get("decision") for e in trail):
            # Answered after this step read its memory (the executor stops counting a call busy only
            # once its result is stored): look again, never re-run a call that finished.
            return True
        starters = [instance for e in trail if (instance := vocab.started_by(e))]
        decisions = [e for e in trail if e.get("role") == "tool" and e.get("decision") and not is_vote(e)]
        requested = [e for e in trail if e.get("role") == "assistant" and e.get("sender") == vocab.SERVER_SENDER]
        if decisions:
            call = call.as_decided(decisions[-1])  # what a person approved is what runs (or is re-run)
        if starters:
            if starters[-1] != self.engine.instance and await self.engine.is_alive(starters[-1]):
                return False  # still running in another process
            return await self._interrupted(call)
        if decisions:
            await self.engine.approvals.carry_out(call, decisions[-1])
            return True
        if requested:
            return False  # waiting for a human
        # The process stopped between the LLM reply and its dispatch (from before replies and
        # their dispatch were written together).
        try:
            await self._write([], [await self._dispatch(call)])
        except Conflict:
            pass  # dispatched meanwhile: look again
        return True

    async def _interrupted(self, call: CallRef) -> bool:
        """A call started by a process that is gone (or by this one, and no longer busy here)."""
        if not await self.engine.executor.may_have_begun(call):
            # Its start was written, but the tool provably never began: run it now (once: see claim).
            return await self.engine.executor.start(call, retry=True)
        tool = (await self.engine.tools_for(self.world, self.agent)).get(call.name)
        if tool is not None and tool.idempotent:
            return await self.engine.executor.start(call, retry=True)
        try:
            await append_result(self.engine.store, call, error_content(INTERRUPTED),
                                extra_ops=self._fenced([Close(vocab.running_key(call.id), must_exist=False)]))
        except Conflict:
            pass
        return True

    async def _dispatch(self, call: CallRef, note: str | None = None) -> Dispatch:
        """How a fresh call goes on: validated, then run, put to a human, or answered with an error."""
        tool = (await self.engine.tools_for(self.world, self.agent)).get(call.name)
        if tool is None or vocab.is_client_name(call.name):
            return Dispatch(result_item(call, error_content(f"unknown tool {call.name!r}"),
                                        extra_ops=[Tag(vocab.AUDIT_TAG)], fields={"rejected": True}), answered=True)
        try:
            args = parse_arguments(tool, call.arguments)
        except ToolArgumentError as exc:
            return Dispatch(result_item(call, error_content(f"invalid arguments for {call.name}: {exc}")),
                            answered=True)
        verdict = evaluate(tool, args, agent=call.agent, chat=call.chat,
                           rules=await self.engine.approvals.rules(self.world),
                           grants=await self.engine.approvals.grants(self.world, call.chat))
        if verdict.verdict == "deny":
            return Dispatch(result_item(call, error_content(verdict.reason), extra_ops=[Tag(vocab.AUDIT_TAG)],
                                        fields={"policy": verdict.record()}), answered=True)
        if verdict.verdict == "ask":
            required = int(verdict.source.get("approvals_required") or 1)
            return Dispatch(await self.engine.approvals.request_item(call, tool, args, note, required=required,
                                                                     asker=self._asker(call.chat)),
                            then=lambda approval: self.engine.approvals.schedule_timeout(self.world, approval))
        if call.location == "server":
            # On the record, in the chat and the audit: which rule, grant or default let it run.
            return Dispatch(self.engine.executor.start_item(call, policy=verdict.record()),
                            then=lambda _: self.engine.executor.launch(call))
        return Dispatch(None)  # an allowed client call stays open until a browser answers it

    # -- the LLM call ----------------------------------------------------------
    async def _llm_turn(self, chat: str, memory: list[Event]) -> bool:
        engine = self.engine
        settings = await engine.worlds.settings(self.world)
        config = await engine.worlds.agent(self.world, self.agent)
        if self._llm_calls_since_human(memory) >= settings["turn_limit"]:
            await engine.store.append(self.world, {
                "kind": vocab.NOTICE, "chat": chat, "agent": self.agent,
                "text": f"{self.agent} reached the turn limit ({settings['turn_limit']} LLM calls since "
                        f"the last human message) and stopped."},
                self._fenced([Close(vocab.turn_key(self.agent, chat))]))
            await engine.status.set(self.world, self.agent, vocab.IDLE)
            return True
        tools = await engine.tools_for(self.world, self.agent)
        message_id = vocab.new_id("msg")
        await engine.status.set(self.world, self.agent, vocab.THINKING, chat=chat, message_id=message_id)

        sent = 0  # characters streamed so far: each chunk says where it starts (`at`), so pages rebuild the text

        async def publish_chunk(text: str) -> None:
            nonlocal sent
            at, sent = sent, sent + len(text)
            await engine.store.publish(self.world, {"type": "chunk", "agent": self.agent, "chat": chat,
                                                    "message_id": message_id, "delta": text, "at": at})

        stream = ChunkStream(publish_chunk)
        partial: list[str] = []  # what the current attempt streamed (kept if the turn is stopped)

        async def on_text(text: str) -> None:
            partial.append(text)
            await stream.add(text)

        async def on_retry(attempt: int, error: LLMError) -> None:
            nonlocal sent
            stream.discard()
            partial.clear()
            sent = 0
            await engine.store.publish(self.world, {"type": "chunk", "agent": self.agent, "chat": chat,
                                                    "message_id": message_id, "delta": "", "reset": True})
            await engine.status.set(self.world, self.agent, vocab.THINKING, chat=chat, message_id=message_id,
                                    retry=attempt, last_error=str(error))

        started = asyncio.get_running_loop().time()
        # A task of its own, so that a stop (stop_turn) cancels the call and not the runner.
        self._call = asyncio.create_task(complete_with_retries(
            engine.provider_for(config), model=config["model"],
            messages=prepare_input(agent=self.agent, system_prompt=config.get("system_prompt") or "",
                                   # each event gives at most one message: the tail is enough
                                   memory=memory[-2 * settings["context_messages"]:],
                                   max_messages=settings["context_messages"],
                                   entries=self._entries.setdefault(chat, {})),
            tools=[t.spec() for t in tools.values()], on_text=on_text, on_retry=on_retry,
            timeout=settings.get("llm_timeout", DEFAULT_SETTINGS["llm_timeout"]),
            first_token_timeout=settings.get("llm_first_token_timeout", DEFAULT_SETTINGS["llm_first_token_timeout"])),
            name=f"llm-{self.world}-{self.agent}")
        try:
            reply = await self._call
        except LLMError as exc:
            stream.discard()
            engine.metrics.llm_failed(self.world)
            await self._end_turn(chat, f"{self.agent} could not answer: {exc}")
            return True
        except asyncio.CancelledError:
            stopped_by, current = self._stopped_by, asyncio.current_task()
            if self._lease_lost and not (current is not None and current.cancelling()):
                stream.discard()  # the lease is gone: whoever takes it runs the turn again
                return False
            if stopped_by is None or (current is not None and current.cancelling()):
                raise  # the runner itself is stopping
            stream.discard()
            await self._save_stopped(chat, message_id, "".join(partial), stopped_by)
            return True
        finally:
            self._call, self._stopped_by, self._lease_lost = None, None, False
        await stream.close()
        engine.metrics.llm_answered(asyncio.get_running_loop().time() - started)
        dispatched = await self._save_reply(chat, message_id, reply, tools)
        if not dispatched:
            await engine.status.set(self.world, self.agent, vocab.IDLE)
            return True
        unanswered = [call for call, dispatch in dispatched if not dispatch.answered]
        if unanswered:
            await self._show_waiting(chat, unanswered)
        return False  # what the turn waits for now (results, decisions' outcomes) wakes the runner

    async def _save_stopped(self, chat: str, message_id: str, text: str, by: str) -> None:
        """A stopped turn: what was streamed so far, marked as stopped, and the turn closed."""
        note = f"stopped by {by}"
        event: Event = {"kind": vocab.MESSAGE, "id": message_id, "chat": chat, "agent": self.agent,
                        "sender": self.agent, "role": "assistant", "stopped": note,
                        "content": f"{text}\n\n*({note})*" if text.strip() else f"*({note})*"}
        await self.engine.store.append(self.world, event, self._fenced([
            Tag(vocab.memory_tag(chat, self.agent)), Close(vocab.turn_key(self.agent, chat), must_exist=False)]))
        await self.engine.status.set(self.world, self.agent, vocab.IDLE)

    async def _save_reply(self, chat: str, message_id: str, reply: Any, tools: dict[str, Any]
                          ) -> list[tuple[CallRef, Dispatch]]:
        """Write the LLM's reply together with the dispatch of its tool calls: one write, all or nothing."""
        agents = [a["name"] for a in await self.engine.worlds.agents(self.world)]
        targets = addressees(reply.content, agents, sender_agent=self.agent)
        for attempt in range(3):
            calls = [c.to_openai() for c in reply.tool_calls]
            if (attempt or len({c["id"] for c in calls}) != len(calls)
                    or not all(vocab.SAFE_CALL_ID.match(c["id"]) for c in calls)):
                # The model's ids collided with earlier ones, or are odd: ours are unique and plain.
                for call in calls:
                    call["id"] = vocab.new_id("call")
            client = [c["id"] for c in calls if getattr(tools.get(c["function"]["name"]), "location", "") == "client"]
            event: Event = {"kind": vocab.MESSAGE, "id": message_id, "chat": chat, "agent": self.agent,
                            "sender": self.agent, "role": "assistant", "content": reply.content or None}
            if calls:
                event["tool_calls"] = calls
            if client:
                event["client_calls"] = client
            if reply.usage:
                event["usage"] = reply.usage
            ops: list[Op] = [Tag(vocab.memory_tag(chat, self.agent))]
            refs = CallRef.all_in({**event, "world": self.world})
            for call in refs:
                ops += [Open(call.open_key), Claim(vocab.issued_claim(call.id)), Tag(vocab.trail_tag(call.id))]
            for other in targets:
                ops += [Tag(vocab.memory_tag(chat, other)), Open(vocab.turn_key(other, chat), new=False)]
            if not calls and not await self._heard_since_thinking(chat):
                ops.append(Close(vocab.turn_key(self.agent, chat), must_exist=False))
            dispatched = [(call, await self._dispatch(call, note=reply.content)) for call in refs]
            try:
                await self._write([(event, ops)], [d for _, d in dispatched])
            except Conflict as exc:
                if fenced_out(exc):
                    raise
                continue
            return dispatched
        raise RuntimeError("could not save the LLM reply")

    async def _write(self, first: list[Batched], dispatches: list[Dispatch]) -> None:
        """Append `first` and what `dispatches` write in one batch, then do what each says comes after.

        Raises `Conflict` (nothing written, nothing done) when any of them disagrees with the log.
        """
        writing = [(d.item, d.then) for d in dispatches if d.item is not None]
        items = [*first, *(item for item, _ in writing)]
        if items:  # one fence covers the whole batch: it is written all or nothing
            items[0] = (items[0][0], self._fenced(list(items[0][1])))
        written = await self.engine.store.append_batch(self.world, items)
        for (_, then), event in zip(writing, written[len(first):], strict=True):
            if then is not None:
                then(event)
