"""The browser app: htmx pages and an HTML-fragment WebSocket over the engine (an `agent_world.extensions` entry)."""
