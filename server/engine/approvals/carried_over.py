"""What an imported world says people decided, not taken as decided here (`agent-world import`)."""
from __future__ import annotations

from ... import vocab
from ...events import request_id
from ...log import Conflict
from ..actors import Actor
from ..calls.refs import CallRef, append_result, error_content
from .deciding import Approvals


async def close_carried_over(approvals: Approvals, world: str, actor: Actor, reason: str) -> int:
    """Deny every pending request that has votes, and answer every call that an approval or a start
    left to run (`not_run`), without running it: the file's decisions were not made by people here, and
    its votes and askers are the file's word. A request nobody voted on stays: a person here still
    decides it. Returns how many were closed."""
    count = 0
    voted = {approval_id for approval_id, latest in (await approvals.votes(world)).items() if latest.get("decision")}
    for approval in await approvals.pending(world):
        if request_id(approval) in voted:
            count += await approvals.close_unanswered(world, approval, actor, reason)
    seen: set[str] = set()
    for message in await approvals.log.list_open(world, vocab.call_key("")):
        for call in CallRef.all_in(message):
            if call.id in seen or call.location != "server":
                continue
            seen.add(call.id)
            trail = await approvals.log.read_tagged(world, [vocab.trail_tag(call.id)])
            if any(e.get("role") == "tool" and not e.get("decision") for e in trail):
                continue  # it has its result
            if any(vocab.started_by(e) or (e.get("decision") or {}).get("decision") == vocab.APPROVE for e in trail):
                try:
                    await append_result(approvals.store, call, error_content(reason), fields={"not_run": vocab.DENIED})
                    count += 1
                except Conflict:
                    pass  # answered meanwhile
    return count
