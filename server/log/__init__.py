"""The per-world durable event log: the one source of truth."""
from .base import Claim, Close, Conflict, EventLog, Op, Open, Tag

__all__ = ["Claim", "Close", "Conflict", "EventLog", "Op", "Open", "Tag"]
