"""The per-world durable event log: the one source of truth."""
from .base import Batched, Claim, Close, Conflict, EventLog, Fence, Op, Open, Tag

__all__ = ["Batched", "Claim", "Close", "Conflict", "EventLog", "Fence", "Op", "Open", "Tag"]
