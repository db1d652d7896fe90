"""The server surface: HTTP API, JSON WebSocket, access control (docs/protocol.md §1, §2, §5, §6)."""
