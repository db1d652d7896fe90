"""Approval requests (docs/protocol.md §4): the request item an agent's call queues, what it would
change, and who may decide it."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ... import events, vocab
from ...hidden_text import hidden_characters, hidden_warning
from ...log import Batched, Claim, Op, Open, Tag
from ...tools.base import Tool, ToolContext, diff_for_approval
from ...tools.egress.hosts import NETWORK_TOOL
from ...vocab import Event
from ..calls.refs import CallRef
from ..turns.memory import TurnPeople
from ..world.invites import member_name
from ..world.worlds import expires_at
from .decisions import approvals_required, is_network, request_of
from .policy import file_access

if TYPE_CHECKING:
    from ...log import EventLog
    from ..calls.executor import Executor
    from ..world.worlds import Worlds


class Requests:
    """A part of `Approvals` (a mixin): the attributes below, and the methods declared for the type
    checker, are Approvals' own."""

    log: EventLog
    worlds: Worlds
    executor: Executor

    if TYPE_CHECKING:
        async def rules(self, world: str) -> list[Event]: ...
        async def grants(self, world: str, chat: str | None = None) -> list[Event]: ...

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
