"""Tools from MCP servers: connections, settings, trust, masked secrets, forms and results."""
