"""Approval requests and decisions (docs/protocol.md §4): inject, decide, time out, cancel, remember."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from ... import events, vocab
from ...aio import keep
from ...errors import AppError
from ...events import request_id
from ...hidden_text import hidden_characters, hidden_warning
from ...log import Batched, Claim, Close, Conflict, Op, Open, Tag
from ...log.failures import StorageError
from ...metrics import Metrics
from ...redact import REDACTED, contains_redaction
from ...tools.base import Tool, ToolContext, diff_for_approval
from ...tools.egress.hosts import NETWORK_TOOL
from ...tools.registry import ToolArgumentError, parse_arguments
from ...vocab import Event
from ..actors import SYSTEM, Actor
from ..calls.backoff import in_background
from ..calls.executor import Executor
from ..calls.refs import CallRef, append_result, error_content
from ..store import Store
from ..turns.memory import TurnPeople
from ..world.invites import member_name
from ..world.worlds import Worlds, expires_at
from .decisions import approvals_required, is_network, parse_decision, request_of
from .ownership import Refusals
from .policy import PolicyResult, evaluate, file_access
from .rules import RuleBook

logger = logging.getLogger(__name__)


def _parse_ts(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


class Approvals(RuleBook):
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

    # -- requests ------------------------------------------------------------
    async def request_item(self, call: CallRef, tool: Tool, args: dict[str, Any], note: str | None, *,
                           required: int = 1, turn: TurnPeople | None = None,
                           network: dict[str, Any] | None = None, approval_id: str | None = None) -> Batched:
        """A `client.requestApproval` call owned by the agent, queued once appended (then
        `schedule_timeout` it). `required` distinct people must approve it; when more than one, none of
        `turn`'s people are among them: who asked for what the call answers (`askedBy`, `askers`), and
        who retried a failed or stopped reply of that turn (`retriedBy`: the turn is theirs too). They
        are counted as people (`Actor.identity`), since names shown to others are not people
        (server/engine/actors.py). `network` (with its own `approval_id`): a running call's connection
        asks (server/engine/approvals/network.py); `call` is then that call, named `network`."""
        timeout = (await self.worlds.settings(call.world)).get("approval_timeout")
        expires = expires_at(timeout) if timeout else None
        approval_id = approval_id or vocab.approval_id_for(call.id)
        # The real arguments: deciders must see exactly what would run (secret-looking values are
        # hidden on the way out, by `public`), and rules added later must match them.
        request: dict[str, Any] = {"toolCallId": call.id, "toolName": call.name, "toolArguments": args,
                                   "message": note or f"{call.agent} wants to run {call.name}",
                                   "options": list(tool.options), "expiresAt": expires}
        if network is not None:
            request["network"] = network
        if (diff := await self._diff(call, tool, args)) is not None:
            request["diff"] = diff  # what a file write changes, decided on beside its text
        ops: list[Op] = [Open(vocab.approval_key(approval_id)), Claim(vocab.issued_claim(approval_id)),
                         Tag(vocab.trail_tag(call.id)), Tag(vocab.AUDIT_TAG)]
        if found := hidden_characters(args):  # every client warns of them and shows them escaped (§4)
            request |= {"hiddenCharacters": found, "warning": hidden_warning(found)}
        turn = turn or TurnPeople.nobody()
        request |= {"askedBy": turn.asker, "askers": turn.askers}  # whom the call answers: the queue, the audit
        if required > 1:
            # Several people approve one call, once: a grant or a rule would let later calls skip them.
            request |= {"approvalsRequired": required, **({"retriedBy": turn.retriers} if turn.retriers else {}),
                        "options": [o for o in tool.options if o in ("deny", "approve_once")]}
            able = len(await self.deciders(call.world) - set(turn.people))
            if able < required:  # said to everyone at once, not found out by the last one asked
                request["quorumShort"] = (f"needs {required} approvers; only {able} "
                                          f"{'other ' if turn.people else ''}{'person' if able == 1 else 'people'} "
                                          "can approve: it can only be denied")
            ops.append(Open(vocab.quorum_key(approval_id)))
        # Who may decide it, as it is asked (`GET …/approvals/pending` says who may still: `may_decide`).
        names = await self.decider_names(call.world)
        excluded = set(turn.people) if required > 1 else set()
        request["mayDecide"] = [name for person, name in names.items() if person not in excluded]
        # Where several must approve, who may not (kept on the server: `public`).
        event = events.approval_request(call.chat, call.agent, approval_id, request,
                                        people=sorted(set(turn.people)) if required > 1 else None)
        return event, ops

    async def _diff(self, call: CallRef, tool: Tool, args: dict[str, Any]) -> dict[str, Any] | None:
        """What the call would change (`Tool.diff`), shown to everyone who reads the request, spectators
        too: so only where the agent may read the file without a person (a `file_read` rules allow)."""
        if tool.diff is None:
            return None
        reader = (await self.executor.tools_for(call.world, call.agent)).get("file_read")
        path = args.get("path")
        if file_access(reader, path, agent=call.agent, chat=call.chat, rules=await self.rules(call.world),
                       grants=await self.grants(call.world, call.chat)).verdict != "allow":
            return {"path": str(path), "error": "not shown: reading this file needs a person, or a rule denies it"}
        workspace = ToolContext(call.world, call.agent, call.chat, self.executor.workspace_for(call.world), call.id)
        return await diff_for_approval(tool, args, workspace)

    async def tool_asked(self, world: str, agent: str, request: dict[str, Any]) -> Tool | None:
        """The tool a request asks to run: its agent's, or `network` for a connection (None: gone)."""
        if is_network(request):
            return NETWORK_TOOL
        return (await self.executor.tools_for(world, agent)).get(str(request.get("toolName")))

    async def deciders(self, world: str) -> set[str]:
        """The people who may decide in `world` now: the owner, and each member invite (one invite, one
        person, however many sessions it has)."""
        return set(await self.decider_names(world))

    async def decider_names(self, world: str) -> dict[str, str]:
        """Those people (`deciders`) with the names they show: "owner" first, then the members by name.
        Presence is not needed: a member away may still decide."""
        invites = await self.log.list_open(world, "invite:")
        members = sorted((member_name(e["invite"]), vocab.invitee_person(e["invite"]["id"])) for e in invites
                         if e["invite"].get("role") == vocab.MEMBER)
        return {vocab.OWNER_PERSON: "owner"} | {person: name for name, person in members}

    async def may_decide(self, world: str, approval: Event, voted: Sequence[str] = ()) -> list[str]:
        """Who may still decide `approval`, by name: the deciders, less (where several must approve) its
        askers and retriers and who approved so far (the two-person rule, as `_vote` checks it)."""
        several = approvals_required(request_of(approval)) > 1
        people = approval.get("people")
        excluded = set(voted) | (set(people) if several and isinstance(people, list) else set())
        return [name for person, name in (await self.decider_names(world)).items() if person not in excluded]

    async def pending(self, world: str, agent: str | None = None) -> list[Event]:
        """Pending approval messages, oldest first (one FIFO queue per agent)."""
        events = await self.log.list_open(world, vocab.ALL_APPROVALS)
        return [e for e in events if agent is None or e["agent"] == agent]

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
        waited = (_parse_ts(stored["ts"]) - _parse_ts(approval["ts"])).total_seconds()
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

    # -- time-boxed grants --------------------------------------------------
    def schedule_grant_end(self, world: str, grant: dict[str, Any]) -> None:
        """Arm this process's timer for a time-boxed grant's end (`expires_at`). Checks compare with the
        time now, so this is only for everyone to see it go: the first process to close the grant writes
        `grant_expired`, the others (and a revocation first) find it closed and write nothing."""
        end = grant.get("expires_at")
        if not isinstance(end, str):
            return
        key = f"grant:{grant['id']}"
        delay = (_parse_ts(end) - datetime.now(UTC)).total_seconds()
        self._cancel_timer(key)
        self._timers[key] = asyncio.get_running_loop().call_later(max(delay, 0), self._end_grant_later, world, grant)

    def _end_grant_later(self, world: str, grant: dict[str, Any]) -> None:
        self._timers.pop(f"grant:{grant['id']}", None)
        keep(self._tasks, in_background(lambda: self.end_grant(world, grant), f"end grant {grant['id']}"),
             f"end-{grant['id']}")

    async def end_grant(self, world: str, grant: dict[str, Any]) -> bool:
        """Close a time-boxed grant whose end passed, once in the whole log; whether this call did."""
        if not isinstance(grant.get("expires_at"), str) or datetime.now(UTC) < _parse_ts(grant["expires_at"]):
            return False
        try:
            await self.store.append(world, events.grant_expired(grant["id"], grant["expires_at"]),
                                    [Close(vocab.grant_key(grant["chat"], grant["id"])), Tag(vocab.AUDIT_TAG)])
        except Conflict:
            return False  # revoked, or ended by another process first
        return True

    # -- timeouts and cancellation -------------------------------------------
    def schedule_timeout(self, world: str, approval: Event) -> None:
        """Arm this process's timer for a request's stored deadline (`expiresAt`).

        Every process arms one for every pending request it hosts or hears of, so the deadline holds
        whichever of them is still alive; the first to close the request wins, the others find it
        decided and write nothing.
        """
        expires = request_of(approval).get("expiresAt")
        if not expires:
            return
        approval_id = request_id(approval)
        delay = (_parse_ts(expires) - datetime.now(UTC)).total_seconds()
        self._cancel_timer(approval_id)
        self._timers[approval_id] = asyncio.get_running_loop().call_later(
            max(delay, 0), self._expire_later, world, approval_id)

    def _cancel_timer(self, approval_id: str) -> None:
        timer = self._timers.pop(approval_id, None)
        if timer:
            timer.cancel()

    async def _now_or_later(self, job: Callable[[], Awaitable[int]], what: str) -> int:
        """`job`, which follows a write already made; while the log cannot take it (a full disk, Redis
        gone), it is tried again with backoff in the background (0 done now), so the write is not failed."""
        try:
            return await job()
        except StorageError as exc:
            logger.warning("could not %s (%s): trying again in the background", what, exc)
            keep(self._tasks, in_background(job, what), what)
            return 0

    def _expire_later(self, world: str, approval_id: str) -> None:
        # While the log cannot take the denial, it is tried again with backoff: the deadline is never
        # dropped (another process may hold none).
        self._timers.pop(approval_id, None)
        keep(self._tasks, in_background(lambda: self._expire(world, approval_id), f"time out {approval_id}"),
                    f"expire-{approval_id}")

    async def _expire(self, world: str, approval_id: str) -> None:
        """Close a request whose deadline passed."""
        approval = await self.log.get_open(world, vocab.approval_key(approval_id))
        if approval is not None:  # not decided meanwhile, here or elsewhere
            await self.close_unanswered(world, approval, SYSTEM, "timed out", timeout=True)

    async def cancel(self, world: str, actor: Actor, agent: str) -> int:
        """Deny every pending approval of `agent` ("cancelled"); returns how many."""
        actor.require(vocab.CAN_DECIDE, "cancel approvals")
        count = 0
        for approval in await self.pending(world, agent):
            count += await self.close_unanswered(world, approval, actor, f"cancelled by {actor.name}")
        return count

    async def deny_in_chat(self, world: str, actor: Actor, chat: str, reason: str) -> int:
        """Deny every pending approval asked in `chat` (a deleted chat's); returns how many. While the log
        cannot take a denial (a full disk, Redis gone), they are tried again with backoff in the
        background: the chat is gone, and nothing else would deny them."""
        return await self._now_or_later(lambda: self._deny_in_chat(world, actor, chat, reason),
                                        f"deny the pending approvals of chat {chat} in {world}")

    async def _deny_in_chat(self, world: str, actor: Actor, chat: str, reason: str) -> int:
        count = 0
        for approval in await self.pending(world):
            if approval.get("chat") == chat:
                count += await self.close_unanswered(world, approval, actor, reason)
        return count

    async def close_unanswered(self, world: str, approval: Event, actor: Actor, reason: str,
                               timeout: bool = False) -> int:
        """Deny `approval` for `reason` unless it was decided meanwhile; 1 if this closed it, else 0."""
        content: dict[str, object] = {"decision": vocab.DENY, "reason": reason}
        if timeout:
            content["timeout"] = True
        try:
            event = await self.decide(world, approval, content | {"scope": "once"}, actor)
        except AppError as exc:
            if exc.code != vocab.ALREADY_DECIDED:
                logger.warning("could not close approval: %s", exc.message)
            return 0
        return 1 if event else 0

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
