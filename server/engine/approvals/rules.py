"""Rules and session grants (docs/protocol.md §4): what people decided for later calls, and the pending
requests a new one decides at once."""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ... import events, vocab
from ...errors import AppError
from ...events import request_id
from ...log import Batched, Close, Conflict, Open, Tag
from ...tools.egress.hosts import NETWORK, host_glob
from ...tools.globs import exact_match
from ...vocab import Event
from ..actors import SYSTEM, Actor
from ..calls.refs import CallRef
from ..world.worlds import MAX_RULES
from .decisions import MAX_APPROVALS_REQUIRED, Decision, approvals_required, is_network, request_of
from .policy import PolicyResult, evaluate, grant_in_force
from .rule_replay import RULE_EVENTS, RuleReplay

if TYPE_CHECKING:
    from ...tools.base import Tool
    from ..calls.executor import Executor
    from ..store import Store
    from ..world.worlds import Worlds

logger = logging.getLogger(__name__)


def _rule_item(rule: dict[str, Any], actor: Actor) -> Batched:
    return (events.rule_added(rule, actor.sender),
            [Open(vocab.rule_key(rule["id"])), Tag(vocab.AUDIT_TAG)])


class RuleBook:
    """A part of `Approvals` (a mixin): the attributes below, and the methods declared for the type
    checker, are Approvals' own."""

    store: Store
    worlds: Worlds
    executor: Executor

    if TYPE_CHECKING:
        async def pending(self, world: str, agent: str | None = None) -> list[Event]: ...
        async def decide(self, world: str, approval: Event, content: object, actor: Actor,
                         origin: Event | None = None, policy: PolicyResult | None = None) -> Event: ...
        async def _now_or_later(self, job: Callable[[], Awaitable[int]], what: str) -> int: ...
        async def tool_asked(self, world: str, agent: str, request: dict[str, Any]) -> Tool | None: ...

    def _remembered(self, call: CallRef, decision: Decision, actor: Actor, approval_id: str,
                    request: dict[str, Any]) -> Batched | None:
        """What a wider scope adds, written with the decision itself (one write: never a decision whose rule
        was lost): a world rule (`always`) or a grant for this agent in this chat (`session`; `for`: one
        that ends at `expires_at`), with the decision's effect (a denial's scope means denial). None for `once`.
        A network request's rule or grant is for its host:port only (a rule's `match` may widen it)."""
        effect = "allow" if decision.decision == vocab.APPROVE else "deny"
        # (its host as a glob of itself: `[2001:db8::1]:443` unescaped is a character class, matching `d:443`)
        exact = exact_match({"host": str(request["toolArguments"]["host"])}) if is_network(request) else None
        if decision.scope == "always":
            widened = host_glob(decision.match) if decision.match and exact is not None else decision.match
            return _rule_item({"id": vocab.new_id("rule"), "tool": call.name, "match": widened or exact or {},
                               "effect": effect, "reason": decision.reason, "by": actor.sender,
                               "approval_id": approval_id}, actor)
        if decision.scope in ("session", "for"):
            grant_id = vocab.new_id("grant")
            grant: dict[str, Any] = {"id": grant_id, "chat": call.chat, "agent": call.agent, "tool": call.name,
                     "effect": effect, "reason": decision.reason, "by": actor.sender, "approval_id": approval_id}
            if decision.until is not None:
                grant["expires_at"] = decision.until
            if exact is not None:
                grant["match"] = exact
            return (events.grant_added(grant, actor.sender),
                    [Open(vocab.grant_key(call.chat, grant_id)), Tag(vocab.AUDIT_TAG)])
        return None

    async def add_rule(self, world: str, actor: Actor, tool: str, match: dict[str, str] | None, effect: str,
                       reason: str | None = None, approvals_required: object = 1) -> dict[str, Any]:
        """A world rule: `allow` or `deny` calls (requests already pending that it covers are decided by
        it at once), or `ask` for them, with `approvals_required` distinct people (the two-person rule;
        it applies to calls made from now on)."""
        actor.require(vocab.CAN_DECIDE, "add rules")
        if effect not in ("allow", "deny", "ask") or not isinstance(tool, str) or not tool:
            raise AppError(vocab.INVALID, "a rule needs a tool name and an effect of 'allow', 'deny' or 'ask'")
        if not isinstance(approvals_required, int) or isinstance(approvals_required, bool) \
                or not 1 <= approvals_required <= MAX_APPROVALS_REQUIRED \
                or (approvals_required > 1 and effect != "ask"):
            raise AppError(vocab.INVALID, f"approvals_required is 1 to {MAX_APPROVALS_REQUIRED}, "
                                          "and more than 1 only with effect 'ask'")
        await self.require_room_for_rule(world)
        if tool == NETWORK and match:
            match = host_glob(match)
        rule: dict[str, Any] = {"id": vocab.new_id("rule"), "tool": tool, "match": match or {}, "effect": effect,
                                "reason": reason, "by": actor.sender, "approval_id": None}
        if effect == "ask":
            rule["approvals_required"] = approvals_required
        added = _rule_item(rule, actor)
        await self.store.append(world, *added)
        if effect != "ask":
            await self._apply_to_pending(world, added[0])
        return rule

    async def require_room_for_rule(self, world: str) -> None:
        """Refuse one more rule or session grant in a world that has MAX_RULES of them open."""
        if len(await self.rules(world)) + len(await self.grants(world)) >= MAX_RULES:
            raise AppError(vocab.CONFLICT, f"world {world!r} already has {MAX_RULES} rules and session grants, "
                                           f"the most a world may have: revoke some first")

    async def _apply_to_pending(self, world: str, added: Event) -> int:
        """The rule or grant of `added` (its `rule_added` or `grant_added` event) was just added: decide
        the pending requests it decides, exactly as `evaluate` would for a fresh call with the world's
        rules and grants as they are. Those that another rule or grant would decide are left to people:
        they were asked for under other rules, and a rule revoked since is no one's decision to run them
        (nor is a new rule's write that was not stored). A request that needs several people is only ever
        denied this way: an allowance is not a person. The rule is stored: while the log refuses a
        decision, they are tried again in the background (a client's retry would add it twice)."""
        new_id = (added.get("rule") or added["grant"])["id"]
        return await self._now_or_later(lambda: self._decide_pending(world, new_id), f"apply the new rules of {world}")

    async def _decide_pending(self, world: str, new_id: str) -> int:
        decided = 0
        rules, grants = await self.rules(world), await self.grants(world)
        for approval in await self.pending(world):
            verdict = await self._verdict(world, approval, rules, grants)
            if verdict is not None and new_id in (verdict.source.get("rule_id"), verdict.source.get("grant_id")) \
                    and await self._decide_by(world, approval, verdict):
                decided += 1
        return decided

    async def _verdict(self, world: str, approval: Event, rules: list[Event],
                       grants: list[Event]) -> PolicyResult | None:
        """What `rules` and `grants` decide for a pending request, exactly as `evaluate` would for a fresh
        call; None when they leave it to people (an allowance is not a person: a request that needs
        several is only ever denied this way), or its agent or tool is gone."""
        request = request_of(approval)
        args = request.get("toolArguments")
        try:
            tool = await self.tool_asked(world, approval["agent"], request)
        except AppError as exc:
            if exc.code != vocab.NOT_FOUND:
                raise
            return None  # its agent was removed: the request waits for a person (or a cancel), as it was
        if tool is None or not isinstance(args, dict):
            return None
        verdict = evaluate(tool, args, agent=approval["agent"], chat=approval["chat"], rules=rules, grants=grants)
        if verdict.verdict == "ask" or (verdict.verdict == "allow" and approvals_required(request) > 1):
            return None
        return verdict

    async def _decide_by(self, world: str, approval: Event, verdict: PolicyResult) -> bool:
        content = {"decision": vocab.APPROVE if verdict.verdict == "allow" else vocab.DENY, "scope": "once"}
        try:
            await self.decide(world, approval, content, SYSTEM, policy=verdict)
            return True
        except AppError as exc:
            if exc.code != vocab.ALREADY_DECIDED:  # decided meanwhile by someone: nothing to do
                logger.warning("a new rule could not decide %s: %s", request_of(approval)["toolCallId"], exc.message)
            return False

    async def _decide_what_a_restart_cut_short(self, world: str, pending: list[Event]) -> int:
        """A rule or grant added while requests were pending decides them at once; a restart (or a log
        that refused the decisions until it) may have cut that short. A request still pending is decided
        now only where the rules and grants agree then and now: as they stood when one was added after
        the request (replayed from the log) and as they are. Never by today's rules alone (an "ask" rule
        revoked since would then approve a request nobody allowed), nor by a rule revoked since, nor by
        a tool's default: only a rule or a grant decides here."""
        if not pending:
            return 0
        # The replay judges each request with its agent's tools as they are now: only right where the
        # agent and the world (its tools' settings, MCP servers) are as they were when it was asked. An
        # agent removed, or its tools changed, while a rule was added left the request to people live.
        agent_keys = {vocab.agent_key(str(approval.get("agent"))) for approval in pending}
        opened = await self.store.log.get_open_many(world, [vocab.world_key(), *sorted(agent_keys)])  # one read
        world_event = opened.get(vocab.world_key())
        kept: list[Event] = []
        for approval in pending:
            agent_event = opened.get(vocab.agent_key(str(approval.get("agent"))))
            if world_event is not None and agent_event is not None \
                    and max(world_event["seq"], agent_event["seq"]) < approval["seq"]:
                kept.append(approval)
        pending = kept
        if not pending:
            return 0
        replay = RuleReplay()
        then: dict[str, str] = {}  # approval id -> the verdict of the first addition after it that decided it
        judged: dict[str, int] = {}  # approval id -> its tool's `replay.changes` when it was last judged
        async for event in self._rule_history(world):
            if not replay.step(event):
                continue
            for approval in pending:
                approval_id, tool = request_id(approval), str(request_of(approval).get("toolName"))
                # Judged again only when its tool's rules changed: not (requests x additions x rules) checks,
                # which held the event loop for 25 s at hosting on a trail of 2,000 rules.
                if approval["seq"] < event["seq"] and approval_id not in then \
                        and judged.get(approval_id) != replay.changes(tool):
                    judged[approval_id] = replay.changes(tool)
                    verdict = await self._verdict(world, approval, replay.rules, replay.grants)
                    if verdict is not None:
                        then[approval_id] = verdict.verdict
        decided = 0
        rules_now, grants_now = await self.rules(world), await self.grants(world)
        for approval in pending:
            was = then.get(request_id(approval))
            verdict = None if was is None else await self._verdict(world, approval, rules_now, grants_now)
            if verdict is not None and verdict.verdict == was and ("rule_id" in verdict.source
                                                                   or "grant_id" in verdict.source) \
                    and await self._decide_by(world, approval, verdict):
                decided += 1
        return decided

    async def _rule_history(self, world: str, page: int = 1000) -> AsyncIterator[Event]:
        """Every rule and grant added or revoked in `world`, oldest first (from its audit trail)."""
        after = 0
        while batch := await self.store.log.read_tagged(world, [vocab.AUDIT_TAG], after=after, limit=page):
            for event in batch:
                if event["kind"] in RULE_EVENTS:
                    yield event
            after = batch[-1]["seq"]

    async def rules(self, world: str) -> list[Event]:
        return await self.worlds.rules(world)

    async def grants(self, world: str, chat: str | None = None) -> list[Event]:
        """The grants in force: a time-boxed one past its end is not, whether or not its `grant_expired`
        was written yet (the check compares with the time now: no timer is needed for it to end)."""
        grants = await self.worlds.grants(world)
        now = datetime.now(UTC)
        return [g for g in grants if (chat is None or g["grant"]["chat"] == chat) and grant_in_force(g["grant"], now)]

    async def revoke_rule(self, world: str, actor: Actor, rule_id: str) -> None:
        actor.require(vocab.CAN_MANAGE, "revoke rules")
        await self._revoke(world, events.rule_revoked(rule_id, actor.sender), vocab.rule_key(rule_id))

    async def revoke_grant(self, world: str, actor: Actor, grant_id: str) -> None:
        actor.require(vocab.CAN_MANAGE, "revoke session grants")
        match = [e for e in await self.grants(world) if e["grant"]["id"] == grant_id]
        if not match:
            raise AppError(vocab.NOT_FOUND, f"no session grant {grant_id}")
        key = vocab.grant_key(match[0]["grant"]["chat"], grant_id)
        await self._revoke(world, events.grant_revoked(grant_id, actor.sender), key)

    async def _revoke(self, world: str, revoked: Event, key: str) -> None:
        try:
            await self.store.append(world, revoked, [Close(key), Tag(vocab.AUDIT_TAG)])
        except Conflict:
            raise AppError(vocab.NOT_FOUND, f"nothing to revoke at {key}") from None
