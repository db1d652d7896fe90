"""Elicitation through the approval queue: an MCP server asks the human something mid-call.

Each request becomes a pending item of the calling agent's queue: a server-sent assistant message
with one `client.elicit` call (so `prepare` keeps it from the LLM, as all `client.*` traffic), whose
id derives from the tool call: `elicitation_<n>_<call id>` for its n-th question (the count first, so
that no two calls' questions share an id whatever `_` their ids hold). It is answered like a client
call, through `ownership.resolve`: a `role: "tool"` message with that id, whose content is
`{"action": "accept", "content": {...}}`, `{"action": "decline"}` or `{"action": "cancel"}`; an
accepted answer is checked against the form's schema first. The first answer wins (the item's key
closes once). The process running the call waits for the answer on the world's bus channel, so an
answer taken by another process reaches it. A timeout answers `cancel`; a session that ends while
the item is pending closes it as interrupted.

Questions are bounded (issue #30): a call has at most `PER_CALL` open at once, a world at most its
`elicitation_limit`; a question past either bound is declined at once (the server is told why in the
result's `_meta.reason`, and the server's log says so once per call), never queued. The call's own
deadline (`mcp_timeout`) keeps running while its questions wait.

URL mode (the spec's out-of-band consent): instead of a form, the question carries `mode: "url"`, the
`url` and its `host` (checked: http(s), no credentials in it, the host in IDNA). The page shows both and a
link the person opens themselves; nothing opens by itself. Their answer is only an action (`accept`
once they did what the page asked, `decline`, `cancel`), which goes back to the server without content.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from ... import events, vocab
from ...aio import keep
from ...bus import Gap, Overflow
from ...errors import AppError
from ...events import request_id
from ...log import Claim, Close, Conflict, Open, Tag
from ...log.failures import StorageError
from ...tools.base import ToolContext
from ...tools.mcp.forms import check_answer, check_schema, check_url, check_url_answer
from ...vocab import Event
from ..actors import Actor
from ..calls.backoff import in_background, until_stored
from ..store import Store, channel
from ..world.worlds import Worlds, expires_at
from .ownership import Refusals

if TYPE_CHECKING:  # imported where first used (a server's question): `import mcp` costs ~2 s of startup
    from mcp import types as mcp_types

logger = logging.getLogger(__name__)

ELICIT: str = vocab.CLIENT_PREFIX + "elicit"
PREFIX = "elicitation_"
DEFAULT_TIMEOUT = 600.0  # seconds a question waits for a person (the world's approval_timeout when set)
PER_CALL = 5  # questions one call may have open at once
DEFAULT_LIMIT = 5  # questions a world may have open at once (its `elicitation_limit`)


def elicitation_key(elicitation_id: str) -> str:
    return f"elicitation:{elicitation_id}"


class Elicitations:
    def __init__(self, store: Store, refusals: Refusals, worlds: Worlds) -> None:
        self.store = store
        self.refusals = refusals
        self.worlds = worlds  # a world's approval_timeout bounds its questions too
        self._asked: dict[str, int] = {}  # call id -> questions asked so far
        self._answers: dict[str, asyncio.Future[dict[str, Any]]] = {}  # question id -> its answer, here
        self._waiting: dict[str, str] = {}  # question id -> the call waiting for it, here
        self._open: dict[str, int] = {}  # world -> its questions open here
        self._refused: set[str] = set()  # calls whose questions were declined for a bound (logged once each)
        self._tasks: set[asyncio.Task[None]] = set()
        store.observers.append(self._observe)

    def _observe(self, world: str, event: Event) -> None:
        """An MCP call's result written here: a question of that call nobody here waits for is an orphan
        (its process died, and this one reports the call interrupted): close it with that reason."""
        call_id = event.get("tool_call_id")
        if event.get("role") != "tool" or "__" not in str(event.get("name") or "") or not isinstance(call_id, str) \
                or event.get("decision") or call_id in self._waiting.values():
            return
        keep(self._tasks, self._close_orphans(world, call_id), f"close-questions-{call_id}")

    async def _close_orphans(self, world: str, call_id: str) -> None:
        try:
            for question in await self.store.log.list_open(world, elicitation_key(PREFIX)):
                if (question.get("elicitation") or {}).get("toolCallId") == call_id:  # this call's, not a namesake's
                    await self._close(world, question, {"action": "cancel"}, "interrupted")
        except Exception:  # it stays pending; an answer to it then finds no call waiting
            logger.warning("could not close the questions of %s", call_id, exc_info=True)

    async def ask(self, ctx: ToolContext, tool: str, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        """Put the question to the agent's queue and wait for a person's answer (or the timeout)."""
        from mcp import types as mcp_types  # loaded by then: the asking server's connection imported it
        try:
            if getattr(params, "mode", "form") == "url":  # out of band: a page the person opens themselves
                url, host = check_url(getattr(params, "url", None))
                asked: dict[str, Any] = {"mode": "url", "url": url, "host": host}
                server_id = getattr(params, "elicitation_id", None)
                if server_id:
                    asked["elicitationId"] = str(server_id)[:200]
            else:
                asked = {"requestedSchema": check_schema(getattr(params, "requested_schema", None))}
        except ValueError as exc:
            logger.warning("%s asked a question that cannot be shown: %s", tool, exc)
            return mcp_types.ElicitResult(action="decline", _meta={"reason": str(exc)})
        call_id = ctx.call_id or vocab.new_id("call")
        settings = await self.worlds.settings(ctx.world)
        # No await from the count to the increment: concurrent questions cannot both take the last place.
        refusal = self._over_bound(ctx.world, call_id, int(settings.get("elicitation_limit") or DEFAULT_LIMIT))
        if refusal:
            if call_id not in self._refused:
                self._refused.add(call_id)
                while len(self._refused) > 10_000:
                    self._refused.pop()
                logger.warning("%s (call %s in %s): declined a question: %s", tool, call_id, ctx.world, refusal)
            return mcp_types.ElicitResult(action="decline", _meta={"reason": refusal})
        self._open[ctx.world] = self._open.get(ctx.world, 0) + 1
        try:
            return await self._queue(ctx, tool, params, asked, call_id, settings)
        finally:
            self._open[ctx.world] -= 1
            if not self._open[ctx.world]:
                del self._open[ctx.world]

    def _over_bound(self, world: str, call_id: str, world_limit: int) -> str:
        """Why one more question of this call may not be queued now ("" when it may)."""
        call_open = sum(1 for waiting in self._waiting.values() if waiting == call_id)
        if call_open >= PER_CALL:
            return f"this call already has {PER_CALL} questions open (at most {PER_CALL} per call)"
        if self._open.get(world, 0) >= world_limit:
            return f"this world already has {world_limit} questions open (its elicitation_limit)"
        return ""

    async def _queue(self, ctx: ToolContext, tool: str, params: mcp_types.ElicitRequestParams,
                     asked: dict[str, Any], call_id: str, settings: dict[str, Any]) -> mcp_types.ElicitResult:
        from mcp import types as mcp_types  # loaded by then: the asking server's connection imported it
        count = self._asked[call_id] = self._asked.pop(call_id, 0) + 1  # (re)inserted last: the newest
        while len(self._asked) > 10_000:  # remember recent calls only
            del self._asked[next(iter(self._asked))]
        elicitation_id = f"{PREFIX}{count}_{call_id}"
        timeout = settings.get("approval_timeout") or DEFAULT_TIMEOUT
        request = {"toolCallId": ctx.call_id, "toolName": tool, "message": str(params.message)[:4000],
                   **asked, "expiresAt": expires_at(timeout)}
        event = events.question(ctx.chat, ctx.agent, elicitation_id, ELICIT, request)
        answered = self._answers[elicitation_id] = asyncio.get_running_loop().create_future()
        self._waiting[elicitation_id] = call_id
        try:
            async with self.store.bus.subscribe(channel(ctx.world)) as sub:
                event = await self.store.append(ctx.world, event, [Open(elicitation_key(elicitation_id)),
                                                                   Claim(vocab.issued_claim(elicitation_id)),
                                                                   Tag(vocab.AUDIT_TAG)])
                listener = asyncio.ensure_future(self._hear(sub, ctx.world, event, answered))
                try:
                    async with asyncio.timeout(timeout):
                        answer = await asyncio.shield(answered)
                except TimeoutError:
                    answer = await self._close(ctx.world, event, {"action": "cancel"}, "timeout", wait=True)
                finally:
                    listener.cancel()
        except asyncio.CancelledError:
            # The session ended (or the call was stopped) while a person was still asked: close the item.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._close(ctx.world, event, {"action": "cancel"}, "interrupted"))
            raise
        finally:
            self._answers.pop(elicitation_id, None)
            self._waiting.pop(elicitation_id, None)
        content = answer.get("content") if answer.get("action") == "accept" else None
        return mcp_types.ElicitResult(action=answer["action"], content=content)

    async def _hear(self, sub: Any, world: str, request: Event, answered: asyncio.Future[dict[str, Any]]) -> None:
        """An answer stored by any process, as its event passes on the world's channel (or, after a gap
        in the bus or a cut-off for falling behind, as the log has it)."""
        elicitation_id = request_id(request)
        own = contextlib.AsyncExitStack()  # the subscription this waiter took itself, after a cut-off
        try:
            while not answered.done():
                try:
                    frame = json.loads(await sub.get())
                except Gap as gap:
                    if not gap.down:  # back, or an event's publish failed: the answer may be in the log only
                        await self._look_up(world, request, answered)
                    continue
                except Overflow:  # cut off (nothing more comes on it): listen again, then read what passed
                    fresh = contextlib.AsyncExitStack()
                    sub = await fresh.enter_async_context(self.store.bus.subscribe(channel(world)))
                    own, cut = fresh, own
                    await cut.aclose()  # a cut-off one of its own goes now, with the frames it fell behind by
                    await self._look_up(world, request, answered)
                    continue
                event = frame.get("event") if frame.get("type") == "event" else None
                if event and event.get("tool_call_id") == elicitation_id \
                        and isinstance(event.get("elicitation_answer"), dict) and not answered.done():
                    answered.set_result(event["elicitation_answer"])
        finally:
            await own.aclose()

    async def _look_up(self, world: str, request: Event, answered: asyncio.Future[dict[str, Any]]) -> None:
        found = await until_stored(lambda: self._recorded_answer(world, request),
                                   what=f"read the answer to {request['tool_calls'][0]['id']}")
        if found is not None and not answered.done():
            answered.set_result(found)

    async def _close(self, world: str, request: Event, answer: dict[str, Any], why: str, *,
                     wait: bool = False) -> dict[str, Any]:
        """The server answers for nobody (timeout, interrupted); if a person answered first, theirs stands.
        While the log cannot take the answer (a full disk, Redis gone): with `wait` (the MCP server is
        given what is returned), it is tried again here with backoff, so the server is never told
        "cancel" while a person's answer may still be recorded; without (nobody is given it), it is
        written in the background: nothing else would take the question out of the queue."""
        elicitation_id = request_id(request)
        try:
            if await self._close_once(world, request, answer, why):
                return answer
        except StorageError as exc:
            logger.warning("could not close %s (%s): trying again%s", elicitation_id, exc,
                        "" if wait else " in the background")
            if not wait:
                keep(self._tasks, in_background(lambda: self._close_once(world, request, answer, why),
                                                f"close {elicitation_id}"), f"close-{elicitation_id}")
                return answer
            if await until_stored(lambda: self._close_once(world, request, answer, why),
                                  what=f"close {elicitation_id}"):
                return answer
        return await self._recorded_answer(world, request) or answer

    async def _recorded_answer(self, world: str, request: Event) -> dict[str, Any] | None:
        """The answer that closed the question, as the log has it (heard here already, or read)."""
        elicitation_id = request_id(request)
        found = self._answers.get(elicitation_id)
        if found is not None and found.done():
            return found.result()
        after = int(request.get("seq") or 0)
        while events := await self.store.log.read_tagged(world, [vocab.AUDIT_TAG], after=after, limit=1000):
            for event in events:
                stored = event.get("elicitation_answer")
                if event.get("tool_call_id") == elicitation_id and isinstance(stored, dict):
                    return {k: v for k, v in stored.items() if k != "reason"}
            after = events[-1]["seq"]
        return None

    async def _close_once(self, world: str, request: Event, answer: dict[str, Any], why: str) -> bool:
        """Write the server's answer; False when someone answered first."""
        try:
            await self._append_answer(world, request, answer, vocab.SERVER_SENDER, reason=why)
            return True
        except Conflict:
            return False

    async def _append_answer(self, world: str, request: Event, answer: dict[str, Any], sender: str,
                             reason: str | None = None) -> Event:
        elicitation_id = request_id(request)
        event = events.answer(request["chat"], request["agent"], sender, elicitation_id,
                              json.dumps(answer, ensure_ascii=False),
                              elicitation_answer=answer | ({"reason": reason} if reason else {}))
        stored = await self.store.append(world, event, [Close(elicitation_key(elicitation_id)), Tag(vocab.AUDIT_TAG)])
        waiting = self._answers.get(elicitation_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)
        return stored

    async def answer(self, world: str, request: Event, content: object, actor: Actor) -> Event:
        """A person's answer (the content of their `role: "tool"` message); the first one wins."""
        elicitation_id = request_id(request)
        try:
            parsed = json.loads(content) if isinstance(content, str) else content
            asked = request["elicitation"]
            answer = (check_url_answer(parsed) if asked.get("mode") == "url"
                      else check_answer(asked["requestedSchema"], parsed))
        except ValueError as exc:
            raise AppError(vocab.INVALID, f"{elicitation_id}: {exc}") from None
        try:
            return await self._append_answer(world, request, answer, actor.sender)
        except Conflict:
            raise await self.refusals.refuse(world, actor, vocab.ALREADY_DECIDED,
                                             f"{elicitation_id} was already answered", elicitation_id) from None

    async def pending(self, world: str) -> list[Event]:
        return await self.store.log.list_open(world, "elicitation:")
