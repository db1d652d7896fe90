"""The one place that decides whether a `role: "tool"` message from a client may be applied, and
how a refusal is recorded — the same for HTTP, the JSON WebSocket and the page's socket."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Literal

from ... import events, vocab
from ...aio import keep
from ...errors import AppError
from ...log import Tag
from ...metrics import Metrics
from ...vocab import Event
from ..actors import Actor
from ..store import Store

logger = logging.getLogger(__name__)
_Key = tuple[str, str, str]  # world, sender, code: a member cannot defeat the folding by varying ids
_SAMPLE = 5  # distinct messages a folded entry quotes
FOLD_WINDOW = 10.0  # seconds: repeats of the same refusal within it become one audit entry with a count
DECIDE = "decide approvals or answer tools"
SEND = "send messages"


@dataclass(frozen=True)
class Target:
    """What a client's tool message answers: an approval request, or a client tool's call."""
    kind: Literal["approval", "client_call", "elicitation"]
    event: Event  # the assistant message that issued the id
    origin: Event | None = None  # for an approval: the open assistant message of the call it asks about


@dataclass
class _Fold:
    first: Event  # the refusal as first written
    repeats: int = 0
    ids: list[str] = field(default_factory=list)  # a sample of the ids the repeats named
    messages: list[str] = field(default_factory=list)  # what the repeats said, each once (a sample)
    flush: asyncio.TimerHandle | None = field(default=None, repr=False)


class Refusals:
    """Refusals: counted always, audited for members, never written for spectators or the server.

    A spectator writes nothing to the log, not even by being refused: thirty refused frames must not
    add thirty events. A member's refusal is audited; repeats of the same one (same member, code and
    whatever ids they name) within FOLD_WINDOW are folded into one more entry that carries their count.
    """

    def __init__(self, store: Store, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics
        self._folds: dict[_Key, _Fold] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def refuse(self, world: str, actor: Actor, code: str, message: str,
                     tool_call_id: object = None) -> AppError:
        """Record a refusal as its actor's role says, and return the error to raise. Nothing else is
        written or run."""
        self.metrics.refusals.labels(actor.role, code).inc()
        if actor.is_server or actor.role not in vocab.CAN_DECIDE:
            return AppError(code, message)
        ref = tool_call_id[:200] if isinstance(tool_call_id, str) else None
        key = (world, actor.sender, code)
        fold = self._folds.get(key)
        if fold is not None:
            fold.repeats += 1
            if ref and len(fold.ids) < 10 and ref not in fold.ids:
                fold.ids.append(ref)
            if len(fold.messages) <= _SAMPLE and message not in fold.messages:
                fold.messages.append(message)
            return AppError(code, message)
        event = events.refused(actor.sender, actor.role, code, message, ref)
        fold = self._folds[key] = _Fold(dict(event))
        fold.flush = asyncio.get_running_loop().call_later(FOLD_WINDOW, self._flush_later, world, key)
        await self.store.append(world, event, [Tag(vocab.AUDIT_TAG)])
        return AppError(code, message)

    async def require(self, world: str, actor: Actor, roles: frozenset[str], action: str) -> None:
        """Refuse (as `refuse` records it) unless `actor`'s role may `action`: the one role check for
        writes, whether they come over HTTP, the JSON WebSocket or the page's socket."""
        if actor.role not in roles:
            raise await self.refuse(world, actor, vocab.FORBIDDEN, f"a {actor.role} may not {action}")

    def _flush_later(self, world: str, key: _Key) -> None:
        keep(self._tasks, self._flush(world, key), "refusal-fold")

    async def _flush(self, world: str, key: _Key) -> None:
        fold = self._folds.pop(key, None)
        if fold is None or not fold.repeats:
            return
        try:
            # What the repeats said, not what the first one did: one code covers many refusals.
            said = "; ".join(fold.messages[:_SAMPLE]) + ("; …" if len(fold.messages) > _SAMPLE else "")
            message = (f"{said} (repeated {fold.repeats} times)" if len(fold.messages) == 1
                       else f"{fold.repeats} more refusals: {said}")
            await self.store.append(world, {**fold.first, "count": fold.repeats, "folded": True,
                                            "tool_call_id": fold.ids[0] if len(fold.ids) == 1 else None,
                                            "tool_call_ids": fold.ids, "message": message},
                                    [Tag(vocab.AUDIT_TAG)])
        except Exception:
            logger.exception("could not write %d folded refusals", fold.repeats)

    async def stop(self) -> None:
        """Write what is folded now (at shutdown)."""
        for key, fold in list(self._folds.items()):
            if fold.flush is not None:
                fold.flush.cancel()
            await self._flush(key[0], key)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def resolve(refusals: Refusals, world: str, tool_call_id: object, actor: Actor) -> Target:
    """The pending item `tool_call_id` answers, or raise the refusal (each with its own code)."""
    log = refusals.store.log
    await refusals.require(world, actor, vocab.CAN_DECIDE, DECIDE)
    if not isinstance(tool_call_id, str) or not tool_call_id or len(tool_call_id) > 200:
        raise await refusals.refuse(world, actor, vocab.INVALID, "tool_call_id must be a non-empty string",
                                    tool_call_id)
    # Everything the id could answer, in one read: an approval (with the call it asks about),
    # a browser-run call, or a server-run one.
    asked_about = vocab.call_id_of_approval(tool_call_id)
    keys = [vocab.approval_key(tool_call_id), vocab.client_call_key(tool_call_id), vocab.call_key(tool_call_id),
            f"elicitation:{tool_call_id}"]  # an MCP server's question (engine/approvals/elicitations.py)
    found = await log.get_open_many(world, keys + ([vocab.call_key(asked_about)] if asked_about else []))
    if (event := found.get(keys[3])) is not None:
        return Target("elicitation", event)
    if (event := found.get(keys[0])) is not None:
        return Target("approval", event, found.get(vocab.call_key(asked_about)) if asked_about else None)
    if (event := found.get(keys[1])) is not None:
        return Target("client_call", event)
    if found.get(keys[2]) is not None:
        raise await refusals.refuse(world, actor, vocab.NOT_CLIENT_CALL,
                                    f"{tool_call_id} is run by the server, not answered by a client", tool_call_id)
    if await log.is_claimed(world, vocab.issued_claim(tool_call_id)):
        raise await refusals.refuse(world, actor, vocab.ALREADY_DECIDED,
                                    f"{tool_call_id} was already decided or answered", tool_call_id)
    raise await refusals.refuse(world, actor, vocab.UNKNOWN_TOOL_CALL,
                                f"no tool call {tool_call_id} was issued in this world", tool_call_id)
