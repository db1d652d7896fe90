"""A Python client of Agent World's JSON protocol (docs/protocol.md §6), and `agent-world attach` (tui.py).

It depends on the documented protocol only, never on the server's code.
"""
from .client import (
                     RECONNECT_CODES,
                     Ack,
                     Approval,
                     ClientError,
                     Fatal,
                     NotConnected,
                     ProtocolError,
                     WorldClient,
                     WorldState,
                     ws_url,
)

__all__ = ["RECONNECT_CODES", "Ack", "Approval", "ClientError", "Fatal", "NotConnected", "ProtocolError",
           "WorldClient", "WorldState", "ws_url"]
