"""The events of reaching people (server/engine/notify/): escalations and webhook deliveries."""
from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from .. import vocab
from ..vocab import Event
from .shape import as_event

# -- escalation and webhooks (server/engine/notify/) -------------------------------------------------------

class ApprovalEscalated(TypedDict):
    kind: Literal["approval_escalated"]
    chat: str
    agent: str
    approval_id: str
    to: list[str]  # the owner ("owner") or the members named by `escalate_to`
    after_minutes: float
    sender: str


class WebhookOutcome(TypedDict):
    kind: Literal["webhook_sending", "webhook_delivered", "webhook_failed"]
    hook: str  # `server/webhooks/settings.py` hook_id: no part of its URL
    target: str  # the URL's host, all that is shown of it
    source_seq: int  # the event delivered
    subject: str  # request, decision, timeout or escalation
    instance: str  # the process that sends it
    attempts: NotRequired[int]
    status: NotRequired[int]  # the receiver's last HTTP status
    error: NotRequired[str]
    taken_from: NotRequired[str]  # a `webhook_sending` that took over: the dead process that had the delivery
    sender: str


def approval_escalated(chat: str, agent: str, approval_id: str, to: list[str], after_minutes: float) -> Event:
    return as_event(ApprovalEscalated(kind="approval_escalated", chat=chat, agent=agent, approval_id=approval_id,
                                   to=to, after_minutes=after_minutes, sender=vocab.SERVER_SENDER))


def webhook_outcome(kind: Literal["webhook_sending", "webhook_delivered", "webhook_failed"], hook: str, target: str,
                    source_seq: int, subject: str, instance: str, **more: int | str) -> Event:
    made = WebhookOutcome(kind=kind, hook=hook, target=target, source_seq=source_seq, subject=subject,
                          instance=instance, sender=vocab.SERVER_SENDER)
    return as_event({**made, **more})
