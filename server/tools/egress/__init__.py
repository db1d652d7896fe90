"""The `ask` network mode: a sandbox's only way out is a proxy the server runs for its call."""
