"""The engine on a real log and bus, with the OpenAI double: turns, approvals, calls, MCP, leases."""
