"""Webhook signatures: HMAC-SHA256 over `<unix time>.<body>` (Stripe's scheme), in one header."""
from __future__ import annotations

import hashlib
import hmac

HEADER = "X-Agent-World-Signature"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The header's value: `t=<unix time>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, now: int, tolerance: int = 300) -> bool:
    """What a receiver checks (docs/notifications.md has the same in a few lines): the MAC, and a recent `t`."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    expected = signature(secret, timestamp, body).split("v1=", 1)[1]
    return abs(now - timestamp) <= tolerance and hmac.compare_digest(expected, fields.get("v1", ""))
