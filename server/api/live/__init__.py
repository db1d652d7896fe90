"""The live stream of a world to a socket, and the JSON WebSocket on it (the page's is web/live.py)."""
