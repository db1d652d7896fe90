"""Approval requests and decisions (PROTOCOL §4): inject, decide, time out, cancel, remember."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from .. import vocab
from ..errors import AppError, json_object
from ..metrics import Metrics
from ..log import Batched, Claim, Close, Conflict, Open, Tag
from ..tools.base import Tool
from ..tools.redact import redact
from ..vocab import Event
from .actors import SYSTEM, Actor
from .calls import CallRef, append_result, error_content
from .executor import Executor
from .ownership import refuse
from .store import Store
from .worlds import Worlds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    decision: str  # approve | deny
    scope: str = "once"
    reason: str | None = None
    match: dict[str, str] | None = None

    @property
    def option(self) -> str:
        return "deny" if self.decision == vocab.DENY else f"approve_{self.scope}"


def parse_decision(content: object) -> Decision:
    """A decision from a tool message's `content` (JSON text or an object), or raise `invalid`."""
    content = json_object(content, "a decision's content")
    decision, scope = content.get("decision"), content.get("scope", "once")
    reason, match = content.get("reason"), content.get("match")
    if decision not in (vocab.APPROVE, vocab.DENY):
        raise AppError(vocab.INVALID, "decision must be 'approve' or 'deny'")
    if scope not in vocab.SCOPES:
        raise AppError(vocab.INVALID, "scope must be 'once', 'session' or 'always'")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 2000):
        raise AppError(vocab.INVALID, "reason must be a string of at most 2000 characters")
    if match is not None:
        if scope != "always":
            raise AppError(vocab.INVALID, "match goes with scope 'always'")
        if not isinstance(match, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in match.items()):
            raise AppError(vocab.INVALID, "match must map argument names to glob strings")
    return Decision(decision, scope, reason or None, match or None)


def request_of(approval: Event) -> dict[str, Any]:
    """The parsed arguments of an approval message's `client.requestApproval` call.

    The message carries them parsed too (`approval`), so listing a thousand pending approvals
    does not parse each one's arguments again.
    """
    request = approval.get("approval")
    return request if isinstance(request, dict) else json.loads(approval["tool_calls"][0]["function"]["arguments"])


def pending_entry(approval: Event) -> dict[str, Any]:
    """How a pending approval is listed (REST and snapshot): the request plus where it belongs."""
    return {"id": approval["tool_calls"][0]["id"], "seq": approval["seq"], "ts": approval["ts"],
            "agent": approval["agent"], "chat": approval["chat"], "request": request_of(approval),
            "message": approval}


def _parse_ts(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


class Approvals:
    def __init__(self, store: Store, worlds: Worlds, executor: Executor, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics
        self.log = store.log
        self.worlds = worlds
        self.executor = executor
        self._timers: dict[str, asyncio.TimerHandle] = {}

    # -- requests ------------------------------------------------------------
    async def request_item(self, call: CallRef, tool: Tool, args: dict[str, Any], note: str | None) -> Batched:
        """A `client.requestApproval` call owned by the agent, queued once appended (then
        `schedule_timeout` it)."""
        timeout = (await self.worlds.settings(call.world)).get("approval_timeout")
        expires = None
        if timeout:
            expires = (datetime.now(timezone.utc) + timedelta(seconds=timeout)).isoformat(
                timespec="milliseconds").replace("+00:00", "Z")
        approval_id = vocab.approval_id_for(call.id)
        request = {"toolCallId": call.id, "toolName": call.name, "toolArguments": redact(args),
                   "message": note or f"{call.agent} wants to run {call.name}",
                   "options": list(tool.options), "expiresAt": expires}
        event = {"kind": vocab.MESSAGE, "id": vocab.new_id("msg"), "chat": call.chat, "agent": call.agent,
                 "sender": vocab.SERVER_SENDER, "role": "assistant", "content": None,
                 "tool_calls": [{"id": approval_id, "type": "function",
                                 "function": {"name": vocab.REQUEST_APPROVAL,
                                              "arguments": json.dumps(request, ensure_ascii=False)}}],
                 "approval": request}
        return event, [Open(vocab.approval_key(approval_id)), Claim(vocab.issued_claim(approval_id)),
                       Tag(vocab.trail_tag(call.id)), Tag(vocab.AUDIT_TAG)]

    async def pending(self, world: str, agent: str | None = None) -> list[Event]:
        """Pending approval messages, oldest first (one FIFO queue per agent)."""
        events = await self.log.list_open(world, "approval:")
        return [e for e in events if agent is None or e["agent"] == agent]

    # -- decisions -----------------------------------------------------------
    async def decide(self, world: str, approval: Event, content: object, actor: Actor,
                     origin: Event | None = None) -> Event:
        """Apply a decision; the first valid one wins, any later one gets `already_decided`.

        `origin`, when the caller has it, is the open assistant message of the call in question.
        """
        decision = parse_decision(content)
        request = request_of(approval)
        approval_id = approval["tool_calls"][0]["id"]
        if decision.option not in request["options"]:
            raise AppError(vocab.INVALID, f"this request does not offer {decision.option}")
        if origin is None:
            origin = await self.log.get_open(world, vocab.call_key(request["toolCallId"]))
        call = CallRef.find(origin, request["toolCallId"]) if origin else None
        if call is None:
            raise await refuse(self.store, world, actor, vocab.ALREADY_DECIDED,
                               f"{approval_id}'s tool call already has a result", approval_id)
        event = {"kind": vocab.MESSAGE, "id": vocab.new_id("msg"), "chat": approval["chat"],
                 "agent": approval["agent"], "sender": actor.sender, "role": "tool",
                 "tool_call_id": approval_id,
                 "content": content if isinstance(content, str) else json.dumps(content),
                 "decision": {"decision": decision.decision, "scope": decision.scope,
                              "reason": decision.reason, "match": decision.match, "tool": call.name,
                              "timeout": actor.is_server and isinstance(content, dict) and bool(content.get("timeout"))}}
        ops = [Close(vocab.approval_key(approval_id)), Tag(vocab.trail_tag(call.id)), Tag(vocab.AUDIT_TAG)]
        try:
            if decision.decision == vocab.APPROVE:
                # The tool starts with the decision's own write; its run goes on in the background.
                stored = await self.executor.start_with(call, event, self.executor.claim(call, event, ops))
            else:
                stored = await self.store.append(world, event, ops)
        except Conflict as exc:
            if exc.key != vocab.approval_key(approval_id):
                raise  # not "decided first": the log broke the invariant that approved calls run once
            raise await refuse(self.store, world, actor, vocab.ALREADY_DECIDED,
                               f"{approval_id} was already decided", approval_id) from None
        self._cancel_timer(approval_id)
        self.metrics.approval_wait.observe(max(0.0, (_parse_ts(stored["ts"]) - _parse_ts(approval["ts"])).total_seconds()))
        await self._remember(world, call, decision, actor, approval_id)
        if decision.decision == vocab.DENY:
            await self.carry_out(call, stored)
        return stored

    async def carry_out(self, call: CallRef, decision_event: Event) -> None:
        """Run an approved call, or answer a denied one. Safe to repeat: each happens once."""
        decision = decision_event["decision"]
        if decision["decision"] == vocab.APPROVE:
            await self.executor.start(call)
            return
        who = decision_event["sender"].removeprefix("human:")  # "server" for timeouts
        reason = decision.get("reason")
        message = "approval timed out" if decision.get("timeout") else f"denied by {who}"
        with_reason = {"reason": reason} if reason else {}
        try:
            await append_result(self.store, call, error_content(message, **with_reason))
        except Conflict:
            pass  # another process answered it first

    async def _remember(self, world: str, call: CallRef, decision: Decision, actor: Actor,
                        approval_id: str) -> None:
        effect = "allow" if decision.decision == vocab.APPROVE else "deny"
        if decision.scope == "always":
            await self.add_rule(world, actor, call.name, decision.match, effect, approval_id=approval_id)
        elif decision.scope == "session":
            grant = {"id": vocab.new_id("grant"), "chat": call.chat, "tool": call.name, "effect": effect,
                     "by": actor.sender, "approval_id": approval_id}
            await self.store.append(world, {"kind": vocab.GRANT_ADDED, "grant": grant, "sender": actor.sender},
                                    [Open(vocab.grant_key(call.chat, grant["id"])), Tag(vocab.AUDIT_TAG)])

    # -- rules and grants ----------------------------------------------------
    async def add_rule(self, world: str, actor: Actor, tool: str, match: dict[str, str] | None, effect: str,
                       approval_id: str | None = None) -> dict[str, Any]:
        actor.require(vocab.CAN_DECIDE, "add rules")
        if effect not in ("allow", "deny") or not isinstance(tool, str) or not tool:
            raise AppError(vocab.INVALID, "a rule needs a tool name and an effect of 'allow' or 'deny'")
        rule = {"id": vocab.new_id("rule"), "tool": tool, "match": match or {}, "effect": effect,
                "by": actor.sender, "approval_id": approval_id}
        await self.store.append(world, {"kind": vocab.RULE_ADDED, "rule": rule, "sender": actor.sender},
                                [Open(vocab.rule_key(rule["id"])), Tag(vocab.AUDIT_TAG)])
        return rule

    async def rules(self, world: str) -> list[Event]:
        return await self.worlds.rules(world)

    async def grants(self, world: str, chat: str | None = None) -> list[Event]:
        grants = await self.worlds.grants(world)
        return [g for g in grants if chat is None or g["grant"]["chat"] == chat]

    async def revoke_rule(self, world: str, actor: Actor, rule_id: str) -> None:
        actor.require(vocab.CAN_MANAGE, "revoke rules")
        await self._revoke(world, actor, vocab.RULE_REVOKED, vocab.rule_key(rule_id), {"rule_id": rule_id})

    async def revoke_grant(self, world: str, actor: Actor, grant_id: str) -> None:
        actor.require(vocab.CAN_MANAGE, "revoke session grants")
        match = [e for e in await self.grants(world) if e["grant"]["id"] == grant_id]
        if not match:
            raise AppError(vocab.NOT_FOUND, f"no session grant {grant_id}")
        key = vocab.grant_key(match[0]["grant"]["chat"], grant_id)
        await self._revoke(world, actor, vocab.GRANT_REVOKED, key, {"grant_id": grant_id})

    async def _revoke(self, world: str, actor: Actor, kind: str, key: str, fields: dict[str, Any]) -> None:
        try:
            await self.store.append(world, {"kind": kind, "sender": actor.sender, **fields},
                                    [Close(key), Tag(vocab.AUDIT_TAG)])
        except Conflict:
            raise AppError(vocab.NOT_FOUND, f"nothing to revoke at {key}") from None

    # -- timeouts and cancellation -------------------------------------------
    def schedule_timeout(self, world: str, approval: Event) -> None:
        expires = request_of(approval).get("expiresAt")
        if not expires:
            return
        approval_id = approval["tool_calls"][0]["id"]
        delay = (_parse_ts(expires) - datetime.now(timezone.utc)).total_seconds()
        loop = asyncio.get_running_loop()
        self._cancel_timer(approval_id)
        self._timers[approval_id] = loop.call_later(
            max(delay, 0), lambda: asyncio.ensure_future(self._expire(world, approval)))

    def _cancel_timer(self, approval_id: str) -> None:
        timer = self._timers.pop(approval_id, None)
        if timer:
            timer.cancel()

    async def _expire(self, world: str, approval: Event) -> None:
        self._timers.pop(approval["tool_calls"][0]["id"], None)
        await self._close_unanswered(world, approval, SYSTEM, "timed out", timeout=True)

    async def cancel(self, world: str, actor: Actor, agent: str) -> int:
        """Deny every pending approval of `agent` ("cancelled"); returns how many."""
        actor.require(vocab.CAN_DECIDE, "cancel approvals")
        count = 0
        for approval in await self.pending(world, agent):
            count += await self._close_unanswered(world, approval, actor, f"cancelled by {actor.name}")
        return count

    async def _close_unanswered(self, world: str, approval: Event, actor: Actor, reason: str,
                                timeout: bool = False) -> int:
        content = {"decision": vocab.DENY, "reason": reason}
        if timeout:
            content["timeout"] = True
        try:
            event = await self.decide(world, approval, content | {"scope": "once"}, actor)
        except AppError as exc:
            if exc.code != vocab.ALREADY_DECIDED:
                log.warning("could not close approval: %s", exc.message)
            return 0
        return 1 if event else 0

    def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
