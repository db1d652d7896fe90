"""Tools agents may call: built in, from MCP servers, or run in the browser."""
