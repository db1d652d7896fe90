"""The event bus: live fan-out of frames to every subscriber of a channel, in every process."""
from .base import Backend, Bus, Gap, Overflow, Subscription

__all__ = ["Backend", "Bus", "Gap", "Overflow", "Subscription"]
