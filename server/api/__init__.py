"""The server surface: HTTP API, JSON WebSocket, access control (PROTOCOL §1, §2, §5, §6)."""
