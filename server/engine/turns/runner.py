"""One agent's work loop: its owed turns, one LLM call at a time, its tool calls carried to the end.

Every decision is re-derived from the log on each step, so the same code resumes a turn after a
restart: calls not yet dispatched are dispatched, approved ones run, interrupted ones are reported.
"""
from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from ... import events, offload, vocab
from ...aio import cancel_and_wait
from ...errors import AppError
from ...llm import LLMError, Reply
from ...llm.retry import complete_with_retries
from ...log import Close, Conflict, Open, Tag
from ...log.failures import StorageError
from ...vocab import Event
from ..approvals.decisions import is_vote
from ..calls.refs import CallRef, append_result, error_content
from ..hosting.leases import AgentLease, fenced_out
from ..services import Services
from ..world.worlds import DEFAULT_SETTINGS
from .chunks import ChunkStream
from .dispatch import Dispatcher
from .llm_input import prepare_input
from .memory import AgentMemory, TurnPeople
from .retry_reply import retryable_key
from .supersede import current

logger = logging.getLogger(__name__)
MAX_BACKOFF = 30.0  # seconds between two tries while the storage fails
INTERRUPTED = "interrupted by restart: the tool may or may not have run; check before retrying"


class AgentRunner:
    def __init__(self, services: Services, world: str, agent: str) -> None:
        self.services = services
        self.world = world
        self.agent = agent
        self._wake = asyncio.Event()
        self.lease = AgentLease(services.leases, world, agent, on_gained=self.wake, on_lost=self._cancel_for_lease)
        self._memory = AgentMemory(services.store, services.worlds, world, agent)
        self._dispatcher = Dispatcher(services, world, agent, self.lease, self._memory)
        self._first_chat: str | None = None  # the chat of the first open turn, last time we looked
        self.task: asyncio.Task[None] | None = None
        self._backoff = 0.0  # seconds before the next try while the storage fails
        self._call: asyncio.Task[Any] | None = None  # the LLM call in flight (see stop_turn)
        self._stopped_by: str | None = None
        self._lease_lost = False  # the LLM call in flight was cancelled because the lease is gone

    def _cancel_for_lease(self) -> None:
        """The lease is gone: the LLM call in flight stops (whoever takes the lease runs the turn again)."""
        if self._call is not None and not self._call.done():
            self._lease_lost = True
            self._call.cancel()

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop(), name=f"agent-{self.world}-{self.agent}")

    def wake(self) -> None:
        self._wake.set()

    def storage_lost(self) -> None:
        """The storage lost events of the world (new ones take their seqs): the agent's memory is read again."""
        self._memory.forget()
        self.wake()

    def concerns(self, event: Event) -> bool:
        """Whether `event` may let one of this agent's turns go on, so the runner should look again.

        Not its own replies: their calls were dispatched as they were saved. Nor the bookkeeping
        of approvals and runs: a request or a refusal changes nothing, and an approval starts its
        call in its own write — its outcome, a tool result, is what wakes the runner. A denial does:
        its result is a second write, which may fail (a full disk), and then only the runner answers it.
        """
        kind, role, sender = event.get("kind"), event.get("role"), event.get("sender")
        decision = event.get("decision") if role == "tool" else None
        if kind in (vocab.TOOL_STARTED, vocab.REFUSED) or (
                isinstance(decision, dict) and (decision.get("decision") != vocab.DENY or is_vote(event))):
            return False
        return not (role == "assistant" and sender in (self.agent, vocab.SERVER_SENDER))

    async def stop(self) -> None:
        await cancel_and_wait(self.task)
        await self.lease.release()

    async def _loop(self) -> None:
        offload.working_for(self.world)  # (its LLM call and its redaction and JSON in the workers)
        while True:
            self._wake.clear()
            recheck: float | None = None  # also look again after this long, with or without a wake
            try:
                if not await self.services.worlds.exists(self.world):
                    return
                progressed = False
                turns, memory = await self._renew_and_read()
                if turns and not self.services.leases.exclusive:
                    # another process may die holding the lease or a running call: look again later
                    recheck = self.services.leases.ttl / 2
                for turn in turns if self.lease.holds else ():
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
                logger.warning("agent %s/%s cannot go on: %s: %s", self.world, self.agent, type(exc).__name__, exc,
                            exc_info=not isinstance(exc, StorageError))  # a bug's trace, not a full disk's
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
                self.lease.lose("a write was fenced out")
                return False
            if isinstance(exc, StorageError) or (isinstance(exc, AppError) and exc.code == vocab.NOT_FOUND):
                raise
            logger.exception("agent %s/%s step failed", self.world, self.agent)
            message = exc.message if isinstance(exc, AppError) else f"{type(exc).__name__}: {exc}"
            await self._end_turn(chat, f"{self.agent} stopped after an internal error: {message}")
            return True

    async def _end_turn(self, chat: str, message: str) -> None:
        """Close the turn with an `agent_error` everyone sees; the agent's status says `error`."""
        # In the agent's memory: the turn ends here, unless a person retries it (turn_people).
        await self.services.store.append(self.world, events.agent_error(chat, self.agent, message,
                                                                        self._memory.last_read(chat)),
                                       self.lease.fenced([Tag(vocab.memory_tag(chat, self.agent)),
                                                          Close(vocab.turn_key(self.agent, chat), must_exist=False),
                                                          Open(retryable_key(self.agent, chat), new=False)]))
        await self.services.status.set(self.world, self.agent, vocab.ERROR, chat=chat, last_error=message)

    async def _publish_quietly(self, frame: dict[str, Any]) -> None:
        """A streamed chunk: for show (the stored reply is whole), so a bus that missed it ends nothing."""
        try:
            await self.services.store.publish(self.world, frame)
        except Exception:
            logger.debug("a chunk of %s/%s was not published", self.world, self.agent, exc_info=True)

    async def _set_status_quietly(self, state: str, **extra: Any) -> None:
        try:
            await self.services.status.set(self.world, self.agent, state, **extra)
        except Exception:  # the bus may be what fails
            logger.debug("status of %s/%s not published", self.world, self.agent, exc_info=True)

    def stop_turn(self, by: str) -> bool:
        """Cancel the LLM call in flight (the turn then ends, its partial text kept); False when none is."""
        if self._call is None or self._call.done():
            return False
        self._stopped_by = by
        self._call.cancel()
        return True

    async def _renew_and_read(self) -> tuple[list[Event], list[Event] | None]:
        """Renew the lease, then read the turns (`_turns_and_memory`).

        Read after the renewal, what was read is newer than any write a previous holder of the lease
        made. While this process holds it, the two go side by side (a round trip less on each wake-up
        across processes): a renewal that gives back the same token means nobody else held it in
        between (a token changes with every new holder, and when a lease expired), so the read missed
        no fenced write. Otherwise the turns are read again.
        """
        lease = self.lease
        if self.services.leases.exclusive or not lease.holds:
            await lease.renew()
            return await self._turns_and_memory()
        fence = lease.fence
        _, read = await asyncio.gather(lease.renew(), self._turns_and_memory())
        if not lease.holds or lease.fence == fence:  # (not held: no step is taken on what was read)
            return read
        return await self._turns_and_memory()

    async def _turns_and_memory(self) -> tuple[list[Event], list[Event] | None]:
        """The agent's open turns; with them, if it is still the first, the memory of the chat
        whose turn came first last time — read side by side, so a wake-up waits on one read, not two."""
        turns = self.services.store.log.list_open(self.world, vocab.turns_of(self.agent))
        if self._first_chat is None or not self.lease.holds:
            return await turns, None
        turns_now, memory = await asyncio.gather(turns, self.memory(self._first_chat))
        return turns_now, memory if turns_now and turns_now[0]["chat"] == self._first_chat else None

    async def memory(self, chat: str) -> list[Event]:
        """This agent's memory of `chat` (read incrementally)."""
        return await self._memory.read(chat)

    # -- one step of one turn ------------------------------------------------
    async def _step(self, chat: str, memory: list[Event] | None = None) -> bool:
        """Move the turn in `chat` forward; False when it is waiting on someone else."""
        if memory is None:
            memory = await self.memory(chat)
        answered: set[str] = set()  # tool results since this agent's last reply
        last = None
        for event in reversed(current(memory, self.agent)):  # a superseded reply's calls are not waited for
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
                    changed |= await self._settle(call, TurnPeople.of_reply(last))
                if not changed:
                    await self._show_waiting(chat, missing)
                return changed
        return await self._llm_turn(chat, memory)

    async def _show_waiting(self, chat: str, missing: list[CallRef]) -> None:
        # Quietly: the status is for show, and a bus that missed it must not end a turn whose calls are out.
        pending = await self.services.approvals.pending(self.world, self.agent)
        if pending:
            await self._set_status_quietly(vocab.WAITING_APPROVAL, chat=chat, pending=len(pending))
        elif any(c.location == "client" for c in missing):
            await self._set_status_quietly(vocab.WAITING_APPROVAL, chat=chat, waiting_for="client")
        else:
            # Running here or in another process, or it finished since `_settle` looked (its result wakes
            # this runner): never "waiting", which tells a client nothing more comes without a person.
            running = [c for c in missing if self.services.executor.busy(c.id)] or missing
            await self._set_status_quietly(vocab.RUNNING_TOOL, chat=chat, tool=running[0].name)

    async def _settle(self, call: CallRef, turn: TurnPeople) -> bool:
        """Bring one unanswered call forward from whatever the log says happened to it (`turn`: whom the
        reply that made it answers)."""
        if call.location == "client" or self.services.executor.busy(call.id):
            return False
        trail = await self.services.store.log.read_tagged(self.world, [vocab.trail_tag(call.id)])
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
            if starters[-1] != self.services.leases.instance and await self.services.leases.is_alive(starters[-1]) \
                    and not await self.services.executor.gave_up(call, starters[-1]):
                return False  # still running in another process
            return await self._interrupted(call)
        if decisions:
            await self.services.approvals.carry_out(call, decisions[-1])
            return True
        if requested:
            return False  # waiting for a human
        # The process stopped between the LLM reply and its dispatch (from before replies and
        # their dispatch were written together).
        try:
            await self._dispatcher.write([], [await self._dispatcher.dispatch(call, turn)])
        except Conflict:
            pass  # dispatched meanwhile: look again
        return True

    async def _interrupted(self, call: CallRef) -> bool:
        """A call started by a process that is gone (or by this one, and no longer busy here)."""
        if not await self.services.executor.may_have_begun(call):
            # Its start was written, but the tool provably never began: run it now (once: see claim), while
            # this runner still holds the lease (a runner paused meanwhile finds another ran it).
            return await self.services.executor.start(call, retry=True, fenced=self.lease.fenced([]))
        tool = (await self.services.tools_for(self.world, self.agent)).get(call.name)
        if tool is not None and tool.idempotent:
            return await self.services.executor.start(call, retry=True, fenced=self.lease.fenced([]))
        try:
            await append_result(self.services.store, call, error_content(INTERRUPTED),
                                extra_ops=self.lease.fenced([Close(vocab.running_key(call.id), must_exist=False)]))
        except Conflict:
            pass
        return True

    # -- the LLM call ----------------------------------------------------------
    async def _llm_turn(self, chat: str, memory: list[Event]) -> bool:
        services = self.services
        settings = await services.worlds.settings(self.world)
        config = await services.worlds.agent(self.world, self.agent)
        if self._memory.llm_calls_since_human(memory) >= settings["turn_limit"]:
            read = self._memory.last_read(chat)
            await services.store.append(self.world, events.notice(
                chat, self.agent, f"{self.agent} reached the turn limit ({settings['turn_limit']} LLM calls since "
                                  "the last human message) and stopped.", input_seq=read),
                # A person who spoke since the memory was read starts a new count: the turn stays open.
                # In the agent's memory: what was asked up to `read` is no longer owed (turn_people).
                self.lease.fenced([Tag(vocab.memory_tag(chat, self.agent)),
                                   Close(vocab.turn_key(self.agent, chat), unless_reopened_after=read)]))
            await services.status.set(self.world, self.agent, vocab.IDLE)
            return True
        tools = await services.tools_for(self.world, self.agent)
        message_id = vocab.new_id("msg")

        sent = 0  # characters streamed so far: each chunk says where it starts (`at`), so pages rebuild the text

        async def publish_chunk(text: str) -> None:
            nonlocal sent
            at, sent = sent, sent + len(text)
            await self._publish_quietly({"type": "chunk", "agent": self.agent, "chat": chat,
                                         "message_id": message_id, "delta": text, "at": at})

        stream = ChunkStream(publish_chunk)
        partial: list[str] = []  # what the current attempt streamed (kept if the turn is stopped)

        async def on_text(text: str) -> None:
            if not thinking.done():  # a provider may stream before it awaits anything: the status goes first
                await asyncio.wait([thinking])
            partial.append(text)
            await stream.add(text)

        async def on_retry(attempt: int, error: LLMError) -> None:
            nonlocal sent
            stream.discard()
            partial.clear()
            sent = 0
            await self._publish_quietly({"type": "chunk", "agent": self.agent, "chat": chat,
                                         "message_id": message_id, "delta": "", "reset": True})
            await self._set_status_quietly(vocab.THINKING, chat=chat, message_id=message_id, retry=attempt,
                                           last_error=str(error))

        provider = services.provider_for(config)
        recent = memory[-2 * settings["context_messages"]:]  # each event gives at most one message: the tail is enough
        messages = prepare_input(agent=self.agent, system_prompt=config.get("system_prompt") or "", memory=recent,
                                 max_messages=settings["context_messages"], entries=self._memory.entries(chat))
        # What this call answers: the memory it is given (what is said from now on is owed a turn of its
        # own), and whom (the people whose requests it makes do not count among several approvers).
        input_seq, turn = self._memory.last_read(chat), await self._memory.turn_people(chat, recent)
        started = asyncio.get_running_loop().time()

        def setting(key: str) -> Any:  # (a world stored before a setting existed has no value for it)
            return settings.get(key, DEFAULT_SETTINGS[key])

        async def call() -> Reply:
            await self._within_budget(chat, setting("llm_calls_per_minute"))
            return await complete_with_retries(
                provider, model=config["model"], messages=messages, tools=[t.spec() for t in tools.values()],
                on_text=on_text, on_retry=on_retry, timeout=setting("llm_timeout"),
                first_token_timeout=setting("llm_first_token_timeout"), reply_limit=setting("llm_reply_limit"))

        # A task of its own, so that a stop (stop_turn) cancels the call (or its wait) and not the runner.
        self._call = asyncio.create_task(call(), name=f"llm-{self.world}-{self.agent}")
        # Published beside the LLM request, not before it: no write or round trip in front of the request
        # (its task runs once the request is sent); `on_text` waits for it before the first chunk.
        thinking = asyncio.ensure_future(services.status.set(self.world, self.agent, vocab.THINKING, chat=chat,
                                                             message_id=message_id))
        try:
            try:
                await thinking
            except asyncio.CancelledError:
                self._call.cancel()  # the runner is stopping (a stop_turn cancels the call itself)
                raise
            except Exception:  # the status is for show: the call goes on when the bus missed it
                logger.warning("the thinking status of %s/%s was not published", self.world, self.agent, exc_info=True)
            reply = await self._call
        except LLMError as exc:
            stream.discard()
            services.metrics.llm_failed(self.world)
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
            await self._save_stopped(chat, message_id, "".join(partial), stopped_by, input_seq, turn)
            return True
        finally:
            self._call, self._stopped_by, self._lease_lost = None, None, False
        await stream.close()
        services.metrics.llm_answered(asyncio.get_running_loop().time() - started)
        try:
            dispatched = await self._dispatcher.save_reply(chat, message_id, reply, tools, input_seq=input_seq,
                                                           turn=turn)
        finally:
            # Saved (its approval or tool start is out), or failed: the provider may read the rest of the response.
            if reply.finish is not None:
                reply.finish()
        if not dispatched:
            await services.status.set(self.world, self.agent, vocab.IDLE)
            return True
        unanswered = [call for call, dispatch in dispatched if not dispatch.answered]
        if unanswered:
            await self._show_waiting(chat, unanswered)
        return False  # what the turn waits for now (results, decisions' outcomes) wakes the runner

    async def _within_budget(self, chat: str, per_minute: int) -> None:
        """Wait until the world's budget of LLM calls allows this one (turns/budget.py); the first wait of
        a run says so in the chat, once for every agent that waits then."""
        wait = self.services.llm_budget.reserve(self.world, per_minute)
        if wait.seconds <= 0:
            return
        if wait.tell:
            try:  # (no `agent`: an agent's own notice ends its turn, turn_people; this one only tells)
                await self.services.store.append(self.world, events.notice(
                    chat, None, f"This world made its {per_minute} LLM calls of the last minute "
                                      f"(llm_calls_per_minute): {self.agent} waits {math.ceil(wait.seconds)} s, "
                                      "and other agents may wait too."))
            except StorageError:
                logger.warning("the budget notice of %s/%s was not stored", self.world, self.agent)
        await asyncio.sleep(wait.seconds)

    async def _save_stopped(self, chat: str, message_id: str, text: str, by: str, input_seq: int,
                            turn: TurnPeople) -> None:
        """A stopped turn: what was streamed so far, marked as stopped, and the turn closed."""
        note = f"stopped by {by}"
        content = f"{text}\n\n*({note})*" if text.strip() else f"*({note})*"
        event = events.agent_reply(message_id, chat, self.agent, content, input_seq=input_seq, to=[],
                                   turn=turn.record(), stopped=note)
        await self.services.store.append(self.world, event, self.lease.fenced([
            Tag(vocab.memory_tag(chat, self.agent)), Close(vocab.turn_key(self.agent, chat), must_exist=False),
            Open(retryable_key(self.agent, chat), new=False)]))
        await self.services.status.set(self.world, self.agent, vocab.IDLE)
