"""Approval decisions (docs/protocol.md §4): the one decision path (decide, vote, carry out) and resuming
after a restart. `Approvals` is made of its parts: the requests (requests.py), their deadlines
(deadlines.py), and the rules and grants decisions remember (rules.py)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ... import events, vocab
from ...errors import AppError
from ...events import request_id
from ...log import Batched, Claim, Close, Conflict, Op, Open, Tag
from ...metrics import Metrics
from ...redact import REDACTED, contains_redaction
from ...tools.egress.hosts import NETWORK_TOOL
from ...tools.registry import ToolArgumentError, parse_arguments
from ...vocab import Event
from ..actors import SYSTEM, Actor
from ..calls.executor import Executor
from ..calls.refs import CallRef, append_result, error_content
from ..store import Store
from ..world.worlds import Worlds
from .deadlines import Deadlines, parse_ts
from .decisions import approvals_required, is_network, parse_decision, request_of
from .ownership import Refusals
from .policy import PolicyResult, evaluate
from .requests import Requests
from .rules import RuleBook


class Approvals(Requests, Deadlines, RuleBook):
    def __init__(self, store: Store, worlds: Worlds, executor: Executor, metrics: Metrics,
                 refusals: Refusals) -> None:
        self.store = store
        self.metrics = metrics
        self.log = store.log
        self.worlds = worlds
        self.executor = executor
        self.refusals = refusals
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- decisions -----------------------------------------------------------
    async def decide(self, world: str, approval: Event, content: object, actor: Actor,
                     origin: Event | None = None, policy: PolicyResult | None = None) -> Event:
        """Apply a decision; the first valid one wins, any later one gets `already_decided`.

        `origin`, when the caller has it, is the open assistant message of the call in question;
        `policy`, the rule or grant that decided it when no person did. A request that needs several
        approvals collects them one by one (`_vote`) until the last; a denial ends it at once.
        """
        decision = parse_decision(content)
        request = request_of(approval)
        approval_id = request_id(approval)
        required = approvals_required(request)
        if decision.option not in request["options"]:
            raise AppError(vocab.INVALID, f"this request does not offer {decision.option}")
        if origin is None:
            origin = await self.log.get_open(world, vocab.call_key(request["toolCallId"]))
        call = CallRef.find(origin, request["toolCallId"]) if origin else None
        if call is None and is_network(request) and decision.decision == vocab.DENY:
            # Its command ended without closing it (the process running it died): nothing waits for it,
            # and a denial (a person's, the timeout's, the orphan cleanup's) still takes it out of the queue.
            call = CallRef(world, approval["agent"], approval["chat"], str(request["toolCallId"]),
                           NETWORK_TOOL.name, json.dumps(request.get("toolArguments")))
        if call is None:
            raise await self.refusals.refuse(world, actor, vocab.ALREADY_DECIDED,
                                             f"{approval_id}'s tool call already has a result", approval_id)
        if is_network(request):  # a running call's connection: decided as a call of the `network` tool
            if decision.arguments is not None:
                raise AppError(vocab.INVALID, "a network request cannot be edited: approve it or deny it")
            call = replace(call, name=NETWORK_TOOL.name)
        details: dict[str, Any] = {
            "decision": decision.decision, "scope": decision.scope, "reason": decision.reason,
            "match": decision.match, "tool": call.name,
            "timeout": actor.is_server and isinstance(content, dict) and bool(content.get("timeout"))}
        if decision.until is not None:
            details["until"] = decision.until
        if policy is not None:
            details["policy"] = policy.record()
        if decision.arguments is not None and required > 1:
            raise AppError(vocab.INVALID, "a request that needs several approvals cannot be edited: "
                                          "approve it as it is, or deny it")
        if decision.decision == vocab.APPROVE and policy is None:
            # A person approves what the rules allow now (one may have been added since the request),
            # with their edits if any.
            checked = await self._recheck(call, request, decision.arguments)
            if isinstance(checked, PolicyResult):
                await self.decide(world, approval, {"decision": vocab.DENY, "scope": "once"}, SYSTEM, origin,
                                  policy=checked)
                raise AppError(vocab.FORBIDDEN, f"this call is {checked.reason}: it was refused")
            details |= checked
        event = events.answer(approval["chat"], approval["agent"], actor.sender, approval_id,
                              content if isinstance(content, str) else json.dumps(content), decision=details)
        ops: list[Op] = [Close(vocab.approval_key(approval_id)), Tag(vocab.trail_tag(call.id)),
                         Tag(vocab.AUDIT_TAG)]
        if required > 1:
            if decision.decision == vocab.APPROVE:
                return await self._vote(world, approval, request, call, event, actor)
            ops.append(Close(vocab.quorum_key(approval_id), must_exist=False))
        if decision.scope != "once":  # it adds a rule or a grant: refused before anything is written
            await self.require_room_for_rule(world)
        remembered = self._remembered(call, decision, actor, approval_id, request)
        also = [remembered] if remembered else []
        try:
            stored = await self._write_decision(world, approval, call.as_decided(event), event, ops, actor, also)
        except Exception as exc:
            if remembered and self.log.may_have_stored(exc):
                # Its answer was lost, maybe not the write: the rule may be in force all the same, and the
                # person's retry finds the request decided. The requests it covers are decided from here
                # (a rule that was not stored decides none).
                self.worlds.forget(world)  # the rule, if stored, was not observed as made
                await self._apply_to_pending(world, remembered[0])
            raise
        try:
            if decision.decision == vocab.DENY and not is_network(request):  # (the waiting proxy hears it)
                await self.carry_out(call, stored)
        finally:
            if remembered:  # stored with the decision: in force even when the denial's result was refused
                await self._apply_to_pending(world, remembered[0])
        return stored

    async def _write_decision(self, world: str, approval: Event, call: CallRef, event: Event, ops: list[Op],
                              actor: Actor, also: Sequence[Batched] = ()) -> Event:
        """Append a decision that closes its request, with `also` (the rule or grant it asks for) in the
        same write; an approving one starts the call in that write too."""
        approval_id = request_id(approval)
        try:
            if event["decision"]["decision"] == vocab.APPROVE and not is_network(request_of(approval)):
                # The tool starts with the decision's own write; its run goes on in the background.
                stored = await self.executor.start_with(call, event, ops, also=also)
            else:
                stored, *_ = await self.store.append_batch(world, [(event, ops), *also])
        except Conflict as exc:
            if exc.key not in (vocab.approval_key(approval_id), vocab.quorum_key(approval_id)):
                raise  # not "decided first": the log broke the invariant that approved calls run once
            raise await self.refusals.refuse(world, actor, vocab.ALREADY_DECIDED,
                                             f"{approval_id} was already decided", approval_id) from None
        self._cancel_timer(approval_id)
        waited = (parse_ts(stored["ts"]) - parse_ts(approval["ts"])).total_seconds()
        self.metrics.approval_wait.observe(max(0.0, waited))
        return stored

    async def _recheck(self, call: CallRef, request: dict[str, Any], edits: dict[str, Any] | None
                       ) -> dict[str, Any] | PolicyResult:
        """What a person's approval runs, checked against the world's rules as they are now.

        Without edits: the call as asked, or the deny verdict that now covers it (the request is then
        closed). With edits (merged over the call's own arguments, so a decider never resends a value
        hidden from them): they must fit the tool's schema and pass the rules as if the LLM had written
        them — an edit cannot slip past a deny rule, nor into a call that needs several approvals.
        Returns the decision's edit details ({} for none) or the deny verdict.
        """
        tool = await self.tool_asked(call.world, call.agent, request)
        if tool is None:
            raise AppError(vocab.INVALID, f"tool {call.name!r} is not available any more")
        asked = request.get("toolArguments")
        original: dict[str, Any] = asked if isinstance(asked, dict) else {}
        merged = original
        if edits:
            if contains_redaction(edits):  # at any depth: a list or object argument too
                raise AppError(vocab.INVALID, f"an edited value contains {REDACTED}: the call would run with it")
            try:
                merged = parse_arguments(tool, json.dumps({**original, **edits}))
            except ToolArgumentError as exc:
                raise AppError(vocab.INVALID, f"the edited arguments do not fit {call.name}: {exc}") from None
        verdict = evaluate(tool, merged, agent=call.agent, chat=call.chat, rules=await self.rules(call.world),
                           grants=await self.grants(call.world, call.chat))
        changed = sorted(k for k in set(original) | set(merged) if original.get(k) != merged.get(k))
        if verdict.verdict == "deny":
            if changed:
                raise AppError(vocab.FORBIDDEN, f"the edited call is {verdict.reason}")
            return verdict
        if changed and int(verdict.source.get("approvals_required") or 1) > 1:
            raise AppError(vocab.FORBIDDEN, f"the edited call needs {verdict.source['approvals_required']} "
                                            "approvals: approve the call as it was asked, or deny it")
        return {"arguments": merged, "original": original, "changed": changed} if changed else {}

    async def _vote(self, world: str, approval: Event, request: dict[str, Any], call: CallRef, event: Event,
                    actor: Actor) -> Event:
        """One person's approval of a request that needs several distinct ones (the two-person rule).

        The log decides the count, as it decides "first decision wins": the n-th approval claims the
        slot `vote:<id>:<n>`, so two approving at once get different slots, and the one that takes
        the last slot closes the request and starts the call in the same write. Until then each vote
        keeps the request's quorum item open, which a denial closes: a vote after a denial fails.
        """
        approval_id = request_id(approval)
        required = approvals_required(request)
        if actor.is_server:  # only people count: a rule, a grant or a timeout never approves for them
            raise AppError(vocab.FORBIDDEN, "only people approve a request that needs several approvals")
        # People, not names: one invite signed in several times (a new guest name each time, before)
        # is one person. A request stored before `people` was kept is checked by its names.
        asked = approval.get("people")
        if isinstance(asked, list):  # a turn begun by a message from before `person` lists its sender's name
            asked_for_it = actor.identity in asked or actor.sender in asked
        else:
            asked_for_it = request.get("askedBy") == actor.sender or actor.sender in (request.get("retriedBy") or [])
        if asked_for_it:
            raise await self.refusals.refuse(
                world, actor, vocab.FORBIDDEN,
                f"you asked for this call: {required} other people must approve it", approval_id)
        for _ in range(2 * required + 2):
            latest = await self.log.get_open(world, vocab.quorum_key(approval_id))
            if latest is None:
                raise await self.refusals.refuse(world, actor, vocab.ALREADY_DECIDED,
                                                 f"{approval_id} was already decided", approval_id)
            voters = list((latest.get("decision") or {}).get("voters") or [])  # their names, as shown
            # Who really approved so far (kept on the server: `public`); names for votes stored before `voted`.
            voted = list(latest.get("voted") or voters)
            if actor.identity in voted or actor.sender in voted:
                raise await self.refusals.refuse(world, actor, vocab.ALREADY_DECIDED,
                                                 "you have already approved this request", approval_id)
            voters.append(actor.sender)
            voted.append(actor.identity)
            final = len(voters) >= required
            remaining = await self.may_decide(world, approval, voted)  # what every screen shows next
            vote = {**event, "id": vocab.new_id("msg"), "voted": voted,
                    "decision": {**event["decision"], "voters": voters, "required": required, "final": final,
                                 "may_decide": remaining}}
            ops: list[Op] = [Claim(vocab.vote_claim(approval_id, len(voters))),
                             Claim(vocab.voter_claim(approval_id, actor.identity)),
                             Close(vocab.quorum_key(approval_id)), Tag(vocab.trail_tag(call.id)),
                             Tag(vocab.AUDIT_TAG)]
            try:
                if final:
                    ops.append(Close(vocab.approval_key(approval_id)))
                    return await self._write_decision(world, approval, call, vote, ops, actor)
                ops.append(Open(vocab.quorum_key(approval_id)))  # now pointing at the latest vote
                return await self.store.append(world, vote, ops)
            except Conflict as exc:
                if exc.key.startswith("vote:"):
                    continue  # someone else took this slot: count again
                if exc.key.startswith("voter:"):
                    raise await self.refusals.refuse(world, actor, vocab.ALREADY_DECIDED,
                                                     "you have already approved this request", approval_id) from None
                raise await self.refusals.refuse(world, actor, vocab.ALREADY_DECIDED,
                                                 f"{approval_id} was already decided", approval_id) from None
        raise AppError(vocab.CONFLICT, "too many approvals at once: try again")

    async def votes(self, world: str) -> dict[str, Event]:
        """For each request collecting several approvals, its latest vote (or the request itself), by id."""
        return {e.get("tool_call_id") or request_id(e): e
                for e in await self.log.list_open(world, vocab.ALL_QUORUMS)}

    async def carry_out(self, call: CallRef, decision_event: Event) -> None:
        """Run an approved call, or answer a denied one. Safe to repeat: each happens once."""
        decision = decision_event["decision"]
        if decision["decision"] == vocab.APPROVE:
            await self.executor.start(call.as_decided(decision_event))
            return
        who = vocab.member_of(decision_event["sender"]) or decision_event["sender"]  # "server" for timeouts
        reason = decision.get("reason")
        policy = decision.get("policy") or {}
        message = ("approval timed out" if decision.get("timeout") else str(policy.get("reason")) if policy
                   else f"denied by {who}")
        with_reason = {"reason": reason} if reason else {}
        try:
            await append_result(self.store, call, error_content(message, **with_reason),
                                fields={"not_run": vocab.TIMED_OUT if decision.get("timeout") else vocab.DENIED})
        except Conflict:
            pass  # another process answered it first

    async def resume(self, world: str, pending: list[Event]) -> None:
        """Once a world is hosted again, what a refused write may have left undone before a restart (the
        retries live in the process that began them): the requests of deleted chats are denied, as the
        delete did at once when the log took it; and those a new rule or grant decided at once are
        decided, where the rules then and now agree (`_decide_what_a_restart_cut_short`). The rules as
        they are now alone never decide here: rules removed or settings changed since a request was
        asked would then approve it without anyone."""
        if not pending:
            return
        chats = {chat["id"] for chat in await self.worlds.chats(world)}
        for chat in sorted({str(approval.get("chat")) for approval in pending} - chats):
            await self.deny_in_chat(world, SYSTEM, chat, "chat deleted")
        # While the log refuses these decisions (the disk that cut them short may still be full), they
        # are tried again in the background: hosting (and the engine's start) goes on.
        await self._now_or_later(lambda: self._decide_cut_short(world, chats),
                                 f"decide the requests a restart cut short in {world}")

    async def _decide_cut_short(self, world: str, chats: set[str]) -> int:
        pending = [a for a in await self.pending(world) if a.get("chat") in chats]
        return await self._decide_what_a_restart_cut_short(world, pending)
