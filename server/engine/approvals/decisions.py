"""What a decision says, and what an approval request asks (docs/protocol.md §4)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ... import vocab
from ...errors import AppError, json_object
from ...events import request_id
from ...vocab import Event

MAX_APPROVALS_REQUIRED = 10
MAX_GRANT_MINUTES = 7 * 24 * 60  # a time-boxed grant lasts at most a week: longer is a rule's job


@dataclass(frozen=True)
class Decision:
    decision: str  # approve | deny
    scope: str = "once"
    reason: str | None = None
    match: dict[str, str] | None = None
    arguments: dict[str, Any] | None = None  # edit before approve: merged over the call's own, then run
    until: str | None = None  # scope `for`: when its grant ends (ISO 8601, UTC)

    @property
    def option(self) -> str:
        # A time-boxed grant is a session grant with an end: offered wherever "this chat" is.
        scope = "session" if self.scope == "for" else self.scope
        return "deny" if self.decision == vocab.DENY else f"approve_{scope}"


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _grant_end(content: dict[str, Any]) -> str:
    """When a `for` decision's grant ends: `minutes` from now (1 to a week), or `until` a time in that span."""
    minutes, until = content.get("minutes"), content.get("until")
    now = datetime.now(UTC)
    if (minutes is None) == (until is None):
        raise AppError(vocab.INVALID, "scope 'for' takes either minutes or until")
    if minutes is not None:
        if not isinstance(minutes, int) or isinstance(minutes, bool) or not 1 <= minutes <= MAX_GRANT_MINUTES:
            raise AppError(vocab.INVALID, f"minutes must be a whole number from 1 to {MAX_GRANT_MINUTES}")
        return iso(now + timedelta(minutes=minutes))
    try:
        end = parse_time(until) if isinstance(until, str) else None
    except ValueError:
        end = None
    if end is None or not now < end <= now + timedelta(minutes=MAX_GRANT_MINUTES):
        raise AppError(vocab.INVALID, "until must be an ISO 8601 time in the coming week")
    return iso(end)


def parse_decision(content: object) -> Decision:
    """A decision from a tool message's `content` (JSON text or an object), or raise `invalid`."""
    content = json_object(content, "a decision's content")
    decision, scope = content.get("decision"), content.get("scope", "once")
    reason, match, arguments = content.get("reason"), content.get("match"), content.get("arguments")
    if decision not in (vocab.APPROVE, vocab.DENY):
        raise AppError(vocab.INVALID, "decision must be 'approve' or 'deny'")
    if scope not in vocab.SCOPES:
        raise AppError(vocab.INVALID, "scope must be 'once', 'session', 'for' or 'always'")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 2000):
        raise AppError(vocab.INVALID, "reason must be a string of at most 2000 characters")
    if match is not None:
        if scope != "always":
            raise AppError(vocab.INVALID, "match goes with scope 'always'")
        if not isinstance(match, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in match.items()):
            raise AppError(vocab.INVALID, "match must map argument names to glob strings")
    if arguments is not None:
        # An edited call is approved once: a grant or a rule would stand for calls nobody edited.
        if decision != vocab.APPROVE or scope != "once":
            raise AppError(vocab.INVALID, "arguments (edit before approve) go with approve, scope 'once'")
        if not isinstance(arguments, dict):
            raise AppError(vocab.INVALID, "arguments must be a JSON object: the arguments to change")
    until = _grant_end(content) if scope == "for" else None
    return Decision(decision, scope, reason or None, match or None, arguments, until)


def request_of(approval: Event) -> dict[str, Any]:
    """The parsed arguments of an approval message's `client.requestApproval` call.

    The message carries them parsed too (`approval`), so listing a thousand pending approvals
    does not parse each one's arguments again.
    """
    request = approval.get("approval")
    if isinstance(request, dict):
        return request
    parsed = json.loads(approval["tool_calls"][0]["function"]["arguments"])
    return parsed if isinstance(parsed, dict) else {}


def is_network(request: dict[str, Any]) -> bool:
    """Whether a request asks about a running call's connection (the `ask` network mode), not a call."""
    return isinstance(request.get("network"), dict)


def approvals_required(request: dict[str, Any]) -> int:
    """How many distinct people must approve (the two-person rule); 1 for most requests."""
    required = request.get("approvalsRequired")
    return required if isinstance(required, int) and required > 1 else 1


def is_vote(event: Event) -> bool:
    """Whether `event` is one approval of a request that needs several, not yet the last one."""
    decision = event.get("decision")
    return isinstance(decision, dict) and decision.get("final") is False


def queue_entry(message: Event, request: dict[str, Any]) -> dict[str, Any]:
    """How an item of the approval queue (an approval, an MCP server's question) is listed: its id,
    where it belongs, its parsed `request` and the whole `message` that asked."""
    return {"id": request_id(message), "seq": message["seq"], "ts": message["ts"],
            "agent": message["agent"], "chat": message["chat"], "request": request, "message": message}


def pending_entry(approval: Event, votes: Event | None = None, may_decide: list[str] | None = None
                  ) -> dict[str, Any]:
    """How a pending approval is listed (REST and snapshot): the request plus where it belongs, and
    for a request that needs several approvals, who has approved so far (`votes`: the latest vote);
    `may_decide`, who may still decide it, by name, and `needs`, how many more must."""
    entry = queue_entry(approval, request_of(approval))
    approved_by: list[str] = []
    if approvals_required(entry["request"]) > 1:
        approved_by = entry["approved_by"] = list((votes or {}).get("decision", {}).get("voters") or [])
    entry["needs"] = max(approvals_required(entry["request"]) - len(approved_by), 1)
    entry["may_decide"] = may_decide if may_decide is not None else list(entry["request"].get("mayDecide") or [])
    return entry
